"""docs/security.md on Kubernetes' own API server: what a tenant may write under exactly the built-in
roles the chart aggregates into (deploy/user-roles.yaml: claims into `edit`/`admin`, reads into
`view`), and that each field of the table a tenant may write is refused at admission or has no effect
beyond what the tenant may already do (issue 33 item 2).

Tenants are ServiceAccounts of two namespaces, each bound by a RoleBinding to the built-in `edit`,
`view` or `admin` (as a platform team grants a team its namespace), their requests made with their own
tokens; the real authorizer decides (RBAC, with the clusterrole-aggregation controller of
kube-controller-manager filling the built-in roles from the chart's). The controller runs in the
test's process with the chart's ServiceAccount and RBAC (deploy/controller.yaml), worked until quiet
(tests/binding/conftest.py's `settle`), so "no effect" is judged once it has done all it would do.
GPUs and Nodes are written by the admin, as a node's agent would report them; no kubelet is needed.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from elasticgpu.api import names
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.process.reconciling import Controller
from tests.binding import objects as o
from tests.binding.conftest import new_controller, settle, stop_watches
from tests.kube_cluster import TestCluster, kube_request
from tests.realcluster import install
from tests.realcluster.test_claim_pod import SYSTEM

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(300)]

CUSTOM = f"/apis/{names.GROUP}/{names.VERSION}"
MERGE = {"Content-Type": "application/merge-patch+json"}
ROLES = ("view", "edit", "admin")
PREEMPTING = "elasticgpu.io/preempting"
PREEMPTED_BY = "elasticgpu.io/preempted-by"


@dataclass
class Tenants:
    """Two tenant namespaces `a` and `b`, in each a ServiceAccount per built-in role (`view`, `edit`,
    `admin`), bound by a RoleBinding; `clients[(ns, role)]` is that account's API client. `platform` is
    a ServiceAccount bound cluster-wide to `view` (a ClusterRoleBinding): the on-call's read-only view."""

    a: str
    b: str
    clients: dict[tuple[str, str], client.ApiClient]
    platform: client.ApiClient

    def user(self, namespace: str, role: str) -> str:
        return f"system:serviceaccount:{namespace}:{role}-user"


def _aggregated(api: client.ApiClient) -> bool:
    """The built-in edit and view hold the chart's rules (the aggregation controller copies them in)."""
    roles = client.RbacAuthorizationV1Api(api)
    def resources(role: str) -> set[str]:
        return {r for rule in roles.read_cluster_role(role).rules or [] for r in rule.resources or []}
    return "elasticgpuclaims" in resources("edit") and "gpus" in resources("view")


@pytest.fixture(scope="module")
def tenants(kube_cluster: TestCluster, api_client: client.ApiClient, crds_installed: list[str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:  # fmt: skip
    core, rbac = client.CoreV1Api(api_client), client.RbacAuthorizationV1Api(api_client)
    # The chart's user roles and its ValidatingAdmissionPolicies (pod-claims-immutable among them).
    install.apply_file(api_client, install.DEPLOY / "user-roles.yaml")
    for policy in sorted((install.DEPLOY / "policies").glob("*.yaml")):
        install.apply_file(api_client, policy)
    tag = uuid.uuid4().hex[:6]
    home = tmp_path_factory.mktemp("tenants")
    spaces = [f"sec-a-{tag}", f"sec-b-{tag}"]
    clients: dict[tuple[str, str], client.ApiClient] = {}
    viewer = f"egpu-sec-platform-{tag}"
    try:
        for ns in spaces:
            core.create_namespace({"metadata": {"name": ns, "labels": {"elasticgpu-test": "1"}}})
            for role in ROLES:
                core.create_namespaced_service_account(ns, {"metadata": {"name": f"{role}-user"}})
                rbac.create_namespaced_role_binding(ns, {
                    "metadata": {"name": f"{role}-user"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                    "subjects": [{"kind": "ServiceAccount", "name": f"{role}-user", "namespace": ns}]})  # fmt: skip
        core.create_namespaced_service_account(spaces[0], {"metadata": {"name": "platform-viewer"}})
        rbac.create_cluster_role_binding({
            "metadata": {"name": viewer},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "platform-viewer", "namespace": spaces[0]}]})  # fmt: skip
        deadline = time.monotonic() + 60
        while not _aggregated(api_client):
            assert time.monotonic() < deadline, "the built-in edit/view never took in deploy/user-roles.yaml"
            time.sleep(0.5)
        # A real API server refuses pods until the namespace's "default" ServiceAccount exists.
        for ns in spaces:
            while not core.list_namespaced_service_account(ns, field_selector="metadata.name=default").items:
                assert time.monotonic() < deadline, f"no default ServiceAccount in {ns}"
                time.sleep(0.2)

        def api_of(ns: str, account: str) -> client.ApiClient:
            directory = home / ns
            directory.mkdir(exist_ok=True)
            path = install.service_account_kubeconfig(kube_cluster, account, ns, directory)
            return config.new_client_from_config(config_file=str(path))

        for ns in spaces:
            for role in ROLES:
                clients[(ns, role)] = api_of(ns, f"{role}-user")
        platform = api_of(spaces[0], "platform-viewer")
        yield Tenants(spaces[0], spaces[1], clients, platform)
        platform.close()
    finally:
        for api in clients.values():
            api.close()
        with contextlib.suppress(client.ApiException):
            rbac.delete_cluster_role_binding(viewer)
        for ns in spaces:
            with contextlib.suppress(client.ApiException):
                core.delete_namespace(ns)


# --- who may do what: the authorizer's answers ---------------------------------------------------------

def _allowed(api: client.ApiClient, user: str, namespace: str | None, verb: str, resource: str,
             group: str = names.GROUP) -> bool:  # fmt: skip
    """The real authorizer's answer (SubjectAccessReview, asked as the admin) for a ServiceAccount."""
    resource, _, subresource = resource.partition("/")
    account_ns = user.split(":")[2]
    attributes = {"verb": verb, "group": group, "resource": resource, "subresource": subresource}
    if namespace:
        attributes["namespace"] = namespace
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{account_ns}",
                                 "system:authenticated"], "resourceAttributes": attributes}}  # fmt: skip
    answer = kube_request(api, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)
    assert answer.status == 201, answer.body
    return bool(answer.json()["status"].get("allowed"))


WRITES = ("create", "update", "patch", "delete")
READS = ("get", "list", "watch")
PLATFORM_KINDS = ("elasticgpus", "elasticgpus/status", "gpus", "gpus/status", "elasticgpuclasses")
"""Cluster-scoped: the controller's, the agents', the platform team's."""


def test_the_built_in_roles_grant_claims_as_they_grant_pvcs_and_nothing_the_product_trusts(
        api_client: client.ApiClient, tenants: Tenants) -> None:  # fmt: skip
    """docs/security.md "Who may write what": edit and admin write claims in their namespace and never
    their status, quotas, ElasticGPUs, GPUs, classes or Namespaces; view reads claims and quotas;
    classes are read by every authenticated user; GPUs and ElasticGPUs only by a cluster-wide view."""
    ns, other = tenants.a, tenants.b
    wrong: list[str] = []

    def expect(role: str, verb: str, resource: str, where: str | None, allowed: bool, group: str = names.GROUP,
               user: str | None = None) -> None:  # fmt: skip
        got = _allowed(api_client, user or tenants.user(ns, role), where, verb, resource, group)
        if got != allowed:
            wrong.append(f"{role}: {verb} {resource} in {where or '(cluster)'}: {'allowed' if got else 'denied'}")

    for role in ROLES:
        writes = role != "view"
        for verb in READS:
            for resource in ("elasticgpuclaims", "elasticgpuclaims/status", "elasticgpuquotas"):
                expect(role, verb, resource, ns, True)
            expect(role, verb, "elasticgpuclasses", None, True)  # the class reader (system:authenticated)
            expect(role, verb, "elasticgpuclaims", other, False)  # a RoleBinding holds in its namespace only
        for verb in (*WRITES, "deletecollection"):
            expect(role, verb, "elasticgpuclaims", ns, writes)
            expect(role, verb, "elasticgpuclaims", other, False)
        for verb in WRITES:
            for resource in ("elasticgpuclaims/status", "elasticgpuquotas", "elasticgpuquotas/status"):
                expect(role, verb, resource, ns, False)
            for resource in PLATFORM_KINDS:
                expect(role, verb, resource, None, False)
        for verb in ("update", "patch"):
            expect(role, verb, "namespaces", None, False, group="")  # fair-share weight, node-gpu-access
            expect(role, verb, "nodes", None, False, group="")  # labels, taints: WaitForFirstConsumer placement
            expect(role, verb, "pods/status", ns, False, group="")  # the ClaimsReady condition
        # Cluster-scoped reads need a cluster-wide binding: a RoleBinding of view gives none.
        for resource in ("gpus", "elasticgpus"):
            expect(role, "list", resource, None, False)
    # The baseline the table compares with: what edit already may do with pods.
    for verb in ("create", "update", "patch"):
        expect("edit", verb, "pods", ns, True, group="")
    platform = f"system:serviceaccount:{ns}:platform-viewer"
    for resource in ("gpus", "elasticgpus", "elasticgpuclasses", "elasticgpuclaims"):
        expect("platform view", "list", resource, None, True, user=platform)
        expect("platform view", "create", resource, None if resource != "elasticgpuclaims" else ns, False,
               user=platform)  # fmt: skip
    assert not wrong, "\n".join(wrong)


def test_a_tenant_with_edit_creates_a_claim_and_nothing_else_of_ours(
        api_client: client.ApiClient, tenants: Tenants) -> None:  # fmt: skip
    """The same with real requests and the tenants' own tokens (what the authorizer said is what the
    API server does): edit creates and deletes a claim, is refused its status and the platform's
    objects; view reads claims and classes and writes nothing; admin may not raise its quota."""
    ns = tenants.a
    edit, view, admin = (tenants.clients[(ns, r)] for r in ("edit", "view", "admin"))
    claims = f"{CUSTOM}/namespaces/{ns}/{names.PLURAL_CLAIM}"
    quotas = f"{CUSTOM}/namespaces/{ns}/{names.PLURAL_QUOTA}"
    body = o.claim("mine", ns, cores=10, memory="1Gi", class_name="no-such-class")
    del body["metadata"]["uid"]
    made = kube_request(edit, "POST", claims, body=body)
    assert made.status == 201, made.body
    status = {"status": {"phase": "Bound", "nodeName": "node-x", "gpus": ["GPU-X"]}}
    refused = {
        "claim status": kube_request(edit, "PATCH", f"{claims}/mine/status", body=status, headers=MERGE),
        "a GPU": kube_request(edit, "POST", f"{CUSTOM}/{names.PLURAL_GPU}", body=o.gpu(f"gpu-{ns}")),
        "a class": kube_request(edit, "POST", f"{CUSTOM}/{names.PLURAL_CLASS}", body=o.klass(f"c-{ns}")),
        "an ElasticGPU": kube_request(edit, "POST", f"{CUSTOM}/{names.PLURAL_ELASTIC_GPU}",
                                      body=o.share_egpu(f"e-{ns}", f"gpu-{ns}")),
        "a quota (edit)": kube_request(edit, "POST", quotas, body=_quota(1000)),
        "a quota (admin)": kube_request(admin, "POST", quotas, body=_quota(1000)),
        "the namespace's fair-share weight": kube_request(admin, "PATCH", f"/api/v1/namespaces/{ns}", headers=MERGE,
            body={"metadata": {"annotations": {"elasticgpu.io/fair-share-weight": "100"}}}),
        "view writes a claim": kube_request(view, "POST", claims, body={**body, "metadata": {"name": "v"}}),
    }  # fmt: skip
    assert {what: answer.status for what, answer in refused.items()} == {what: 403 for what in refused}
    assert kube_request(view, "GET", claims).status == 200
    assert kube_request(view, "GET", f"{CUSTOM}/{names.PLURAL_CLASS}").status == 200
    assert kube_request(view, "GET", f"{CUSTOM}/{names.PLURAL_GPU}").status == 403
    assert kube_request(tenants.platform, "GET", f"{CUSTOM}/{names.PLURAL_GPU}").status == 200
    assert kube_request(edit, "DELETE", f"{claims}/mine").status == 200


def _quota(cores: int) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": names.KIND_QUOTA, "metadata": {"name": "team"},
            "spec": {"hard": {names.RESOURCE_CORE: cores}}}  # fmt: skip


def test_fields_set_once_and_resource_rules_are_refused_at_admission(tenants: Tenants) -> None:
    """spec.elasticGPUClassName, spec.elasticGPUName (set once), spec.selector and
    spec.resources.limits (immutable) and the request's rules are the CRD's (schema and CEL): an edit
    tenant's change is refused by the API server itself, whatever the controller would do."""
    ns = tenants.b
    edit = tenants.clients[(ns, "edit")]
    claims = f"{CUSTOM}/namespaces/{ns}/{names.PLURAL_CLAIM}"
    body = o.claim("fixed", ns, cores=10, memory="1Gi", class_name="first", selector={"matchLabels": {"a": "b"}})
    del body["metadata"]["uid"]
    body["spec"]["resources"]["limits"] = {names.RESOURCE_CORE: 10, names.RESOURCE_MEMORY: "1Gi"}
    body["spec"]["elasticGPUName"] = "egpu-first"
    assert kube_request(edit, "POST", claims, body=body).status == 201
    changes = {
        "class": {"spec": {"elasticGPUClassName": "second"}},
        "ElasticGPU": {"spec": {"elasticGPUName": "egpu-second"}},
        "selector": {"spec": {"selector": {"matchLabels": {"a": "c"}}}},
        "limits": {"spec": {"resources": {"limits": {names.RESOURCE_CORE: 100}}}},
        "150 cores": {"spec": {"resources": {"requests": {names.RESOURCE_CORE: 150}}}},
    }
    answers = {what: kube_request(edit, "PATCH", f"{claims}/fixed", body=patch, headers=MERGE)
               for what, patch in changes.items()}  # fmt: skip
    assert {what: a.status for what, a in answers.items()} == {what: 422 for what in changes}, {
        what: a.body[:300] for what, a in answers.items()}
    kube_request(edit, "DELETE", f"{claims}/fixed")


# --- tenant writes the controller reads: no effect beyond the tenant's own ------------------------------

@dataclass
class World:
    """Cards (GPU objects on Nodes, as an agent reports them) and classes for one test, the controller
    under the chart's RBAC, and the tenants' clients."""

    admin: KubeApi
    controller: Controller
    tenants: Tenants
    prefix: str
    nodes: list[str]
    gpus: list[str]
    classes: list[str]

    def klass(self, suffix: str, **fields: Any) -> str:
        parameters = fields.pop("parameters", {"gpuModel": f"T{self.prefix}"})
        body = o.klass(f"{self.prefix}-{suffix}", parameters=parameters, mode=fields.pop("mode", None))
        body.update(fields)
        self.admin.create_class(body)
        self.classes.append(body["metadata"]["name"])
        return str(body["metadata"]["name"])

    def claim(self, namespace: str, name: str, klass: str, cores: int, **labels: str) -> dict[str, Any]:
        """A claim the namespace's edit tenant creates with its token."""
        body = o.claim(name, namespace, cores=cores, memory=None, class_name=klass)
        del body["metadata"]["uid"]
        if labels:
            body["metadata"]["labels"] = labels
        answer = kube_request(self.edit(namespace), "POST", f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}",
                              body=body)  # fmt: skip
        assert answer.status == 201, answer.body
        return dict(answer.json())

    def edit(self, namespace: str) -> client.ApiClient:
        return self.tenants.clients[(namespace, "edit")]

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.admin.get_claim(namespace, name)

    def phase(self, namespace: str, name: str) -> str:
        return str((self.get(namespace, name).get("status") or {}).get("phase"))

    def tenant_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        answer = kube_request(self.edit(namespace), "PATCH", f"{CUSTOM}/namespaces/{namespace}/{names.PLURAL_CLAIM}/"
                              f"{name}", body=patch, headers=MERGE)  # fmt: skip
        assert answer.status == 200, answer.body

    def until(self, check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
        """Work the controller until `check` holds (time-based steps such as a freed reservation's
        recheck need more than one quiet round)."""
        deadline = time.monotonic() + timeout_s
        while True:
            settle(self.controller)
            if check():
                return
            assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
            time.sleep(0.2)


@pytest.fixture
def world(kube_cluster: TestCluster, api_client: client.ApiClient, tenants: Tenants,
          tmp_path: Path) -> Iterator[World]:  # fmt: skip
    install.apply_file(api_client, install.DEPLOY / "controller.yaml", install.IDENTITY_KINDS)
    chart = KubeApi.from_kubeconfig(str(install.service_account_kubeconfig(
        kube_cluster, "elasticgpu-controller", SYSTEM, tmp_path)))
    admin = KubeApi.from_kubeconfig(str(kube_cluster.kubeconfig))
    core = client.CoreV1Api(api_client)
    prefix = f"sec{uuid.uuid4().hex[:6]}"
    world = World(admin, new_controller(chart, None), tenants, prefix, [], [], [])
    try:
        for i, pool in enumerate(("a", "b")):
            node = f"{prefix}-node-{pool}"
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {
                "pool": f"{prefix}-{pool}"}}})  # fmt: skip
            world.nodes.append(node)
            gpu = f"gpu-{prefix}-{i}"
            admin.create_gpu(o.gpu(gpu, node=node, model=f"T{prefix}"))
            world.gpus.append(gpu)
        yield world
    finally:
        stop_watches()
        for ns in (tenants.a, tenants.b):
            for body in admin.list_claims(ns):
                name = body["metadata"]["name"]
                with contextlib.suppress(Exception):
                    admin.patch_claim(ns, name, {"metadata": {"finalizers": []}})
                    admin.delete_claim(ns, name)
            with contextlib.suppress(client.ApiException):
                core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
        for egpu in admin.list_elastic_gpus():
            if (egpu["spec"].get("claimRef") or {}).get("namespace") in (tenants.a, tenants.b):
                with contextlib.suppress(Exception):
                    admin.patch_elastic_gpu(egpu["metadata"]["name"], {"metadata": {"finalizers": []}})
                    admin.delete_elastic_gpu(egpu["metadata"]["name"])
        for gpu in world.gpus:
            with contextlib.suppress(Exception):
                admin.delete_gpu(gpu)
        for klass in world.classes:
            with contextlib.suppress(Exception):
                admin.delete_class(klass)
        for node in world.nodes:
            with contextlib.suppress(client.ApiException):
                core.delete_node(node)
        chart.close()
        admin.close()


def _egpu_of(world: World, namespace: str, name: str) -> dict[str, Any]:
    egpu = world.get(namespace, name)["spec"]["elasticGPUName"]
    return world.admin.get_elastic_gpu(egpu)


def test_a_forged_preemption_plan_and_victim_mark_take_nothing(world: World) -> None:
    """Issue 33 items 1 and 2: `elasticgpu.io/preempting` and `elasticgpu.io/preempted-by` are
    annotations any edit tenant writes on its own claims; the controller's plan lives in the claim's
    status (`status.preemption`, `status.preemptedBy`) that only it writes. A priority-0 claim of
    namespace b whose class never preempts names namespace a's priority-1000 claim as its victim, and
    marks its own Bound claim as preempted: nothing happens to either."""
    a, b = world.tenants.a, world.tenants.b
    high = world.klass("high", priority=1000)
    low = world.klass("never", preemptionPolicy="Never")
    world.claim(a, "victim", high, 100)
    world.claim(b, "mine", low, 100)
    world.until(lambda: world.phase(a, "victim") == "Bound" and world.phase(b, "mine") == "Bound", "both Bound")
    world.claim(b, "forger", low, 100)  # no card is left
    settle(world.controller)
    victim = world.get(a, "victim")
    egpu = _egpu_of(world, a, "victim")
    # The plan in the form the controller itself wrote it before item 1 moved it into status (literal
    # keys: the constants go with the annotations).
    plan = json.dumps({"on": "its card", "victims": [{"elasticGPU": egpu["metadata"]["name"], "claim": f"{a}/victim",
                                                      "uid": victim["metadata"]["uid"]}]})  # fmt: skip
    world.tenant_patch(b, "forger", {"metadata": {"annotations": {PREEMPTING: plan}}})
    world.tenant_patch(b, "mine", {"metadata": {"annotations": {PREEMPTED_BY: f"{a}/victim"}}})
    for _ in range(3):  # time-based steps (a freed reservation's recheck) get their turn too
        settle(world.controller)
        time.sleep(1)
    assert world.phase(a, "victim") == "Bound", world.get(a, "victim")["status"]
    assert (_egpu_of(world, a, "victim").get("status") or {}).get("phase") == "Bound"
    assert world.phase(b, "mine") == "Bound", world.get(b, "mine")["status"]
    assert world.phase(b, "forger") == "Pending", world.get(b, "forger")["status"]


def test_a_group_label_shields_no_claim_from_preemption(world: World) -> None:
    """Issue 33 item 3: `elasticgpu.io/group` (a label any edit tenant writes) makes a claim a member of
    its namespace's group, never immune: a priority-1000 claim preempts a labelled priority-0 one."""
    a, b = world.tenants.a, world.tenants.b
    low = world.klass("low")
    high = world.klass("urgent", priority=1000)
    world.claim(b, "shielded", low, 100, **{names.LABEL_GROUP: "g"})
    world.claim(b, "shielded-2", low, 100, **{names.LABEL_GROUP: "g"})
    world.until(lambda: world.phase(b, "shielded") == "Bound" == world.phase(b, "shielded-2"), "the group Bound")
    world.claim(a, "urgent", high, 100)
    # Without a shield the victims go in seconds (no pods to evict); 30 s keeps a failure short.
    world.until(lambda: world.phase(a, "urgent") == "Bound", "the preemptor Bound past a labelled claim",
                timeout_s=30)


def test_naming_another_namespaces_elasticgpu_binds_nothing(world: World) -> None:
    """spec.elasticGPUName and spec.selector (an edit tenant's): an ElasticGPU bound to another
    namespace's claim is never bound again, named or selected by its labels (as a PV's claimRef)."""
    a, b = world.tenants.a, world.tenants.b
    klass = world.klass("share")
    world.claim(a, "theirs", klass, 30)
    world.until(lambda: world.phase(a, "theirs") == "Bound", "a's claim Bound")
    taken = _egpu_of(world, a, "theirs")
    name = taken["metadata"]["name"]
    for claim, spec in (("named", {"elasticGPUName": name}),
                        ("selected", {"selector": {"matchLabels": {names.LABEL_CLAIM_NAMESPACE: a}}})):  # fmt: skip
        body = o.claim(claim, b, cores=30, memory=None, class_name=klass)
        del body["metadata"]["uid"]
        body["spec"].update(spec)
        answer = kube_request(world.edit(b), "POST", f"{CUSTOM}/namespaces/{b}/{names.PLURAL_CLAIM}", body=body)
        assert answer.status == 201, answer.body
    settle(world.controller)
    assert world.phase(b, "named") == "Pending" and world.phase(b, "selected") == "Pending"
    after = world.admin.get_elastic_gpu(name)
    assert after["spec"]["claimRef"]["uid"] == world.get(a, "theirs")["metadata"]["uid"]
    assert world.phase(a, "theirs") == "Bound"


def test_a_quota_the_tenant_cannot_write_holds_its_claims(api_client: client.ApiClient, world: World) -> None:
    """spec.resources (an edit tenant's) is charged to the namespace's ElasticGPUQuota, which the
    platform team writes (edit and admin may not: the RBAC test): a claim over it stays Pending."""
    b = world.tenants.b
    klass = world.klass("quota")
    answer = kube_request(api_client, "POST", f"{CUSTOM}/namespaces/{b}/{names.PLURAL_QUOTA}", body=_quota(40))
    assert answer.status == 201, answer.body
    try:
        world.claim(b, "within", klass, 30)
        world.until(lambda: world.phase(b, "within") == "Bound", "the claim within the quota")
        world.claim(b, "over", klass, 30)
        world.until(lambda: (world.get(b, "over").get("status") or {}).get("reason") == "QuotaExceeded",
                    "the claim over the quota held")  # fmt: skip
        assert world.phase(b, "over") == "Pending"
    finally:
        kube_request(api_client, "DELETE", f"{CUSTOM}/namespaces/{b}/{names.PLURAL_QUOTA}/team")


def _pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {names.LABEL_USES_CLAIMS: "true"}, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}],
                     # The test's Nodes have no kubelet: the node lifecycle controller taints them.
                     "tolerations": [{"operator": "Exists"}],
                     "schedulingGates": [{"name": names.SCHEDULING_GATE}]}}  # fmt: skip


def _claims_ready(api_client: client.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    found = client.CoreV1Api(api_client).read_namespaced_pod(pod, namespace).status.conditions or []
    return next(({"status": c.status, "reason": c.reason, "message": c.message} for c in found
                 if c.type == "elasticgpu.io/ClaimsReady"), {})  # fmt: skip


def test_a_pods_claim_keys_reach_only_its_namespace_and_cannot_change(
        api_client: client.ApiClient, world: World) -> None:  # fmt: skip
    """`egpuc.elasticgpu.io/<container>` names a claim of the pod's own namespace only: a pod of b that
    names a's claim (by its name, or as `a/name`) stays gated and a's claim keeps its card. The claim
    annotations, the inline request and `elasticgpu.io/uses-claims` cannot change once the pod exists
    (deploy/policies/pod-claims-immutable.yaml), for an edit tenant as for anyone."""
    a, b = world.tenants.a, world.tenants.b
    klass = world.klass("pods")
    world.claim(a, "theirs", klass, 30)
    world.until(lambda: world.phase(a, "theirs") == "Bound", "a's claim Bound")
    edit = world.edit(b)
    pods = f"/api/v1/namespaces/{b}/pods"
    for pod, value in (("by-name", "theirs"), ("by-path", f"{a}/theirs")):
        answer = kube_request(edit, "POST", pods, body=_pod(pod, {names.claim_annotation("main"): value}))
        assert answer.status == 201, answer.body
    world.until(lambda: all(_claims_ready(api_client, b, p).get("status") == "False" for p in ("by-name", "by-path")),
                "both pods told why they wait")  # fmt: skip
    for pod, reason in (("by-name", "ClaimNotFound"), ("by-path", "InvalidClaimAnnotations")):
        gates = client.CoreV1Api(api_client).read_namespaced_pod(pod, b).spec.scheduling_gates or []
        assert [g.name for g in gates] == [names.SCHEDULING_GATE], (pod, _claims_ready(api_client, b, pod))
        assert _claims_ready(api_client, b, pod)["reason"] == reason, _claims_ready(api_client, b, pod)
    assert world.get(a, "theirs")["status"].get("users") in (None, []), world.get(a, "theirs")["status"]
    changes = {
        "claim annotation": {"metadata": {"annotations": {names.claim_annotation("main"): "other"}}},
        "inline request": {"metadata": {"annotations": {names.inline_request_annotation("main"): "gpu-core=10"}}},
        "uses-claims label": {"metadata": {"labels": {names.LABEL_USES_CLAIMS: None}}},
    }
    answers = {what: kube_request(edit, "PATCH", f"{pods}/by-name", body=patch, headers=MERGE)
               for what, patch in changes.items()}  # fmt: skip
    assert {what: a.status for what, a in answers.items()} == {what: 422 for what in changes}, {
        what: a.body[:300] for what, a in answers.items()}


def test_a_selected_node_annotation_picks_no_node_the_claims_class_rules_out(
        api_client: client.ApiClient, world: World) -> None:  # fmt: skip
    """`elasticgpu.io/selected-node` is the controller's note on a pod (the node chosen for its
    WaitForFirstConsumer claims), on an object the tenant writes. A tenant's value only narrows the
    choice, as the pod's own nodeSelector would: a node the class's nodeSelector rules out is not
    taken; the claim binds where the class allows."""
    b = world.tenants.b
    allowed, ruled_out = world.nodes
    klass = world.klass("wffc", mode="WaitForFirstConsumer",
                        parameters={"gpuModel": f"T{world.prefix}", "nodeSelector": f"pool={world.prefix}-a"})
    world.claim(b, "later", klass, 30)
    body = _pod("chooser", {names.claim_annotation("main"): "later", names.ANNOTATION_SELECTED_NODE: ruled_out})
    answer = kube_request(world.edit(b), "POST", f"/api/v1/namespaces/{b}/pods", body=body)
    assert answer.status == 201, answer.body
    world.until(lambda: world.phase(b, "later") == "Bound", "the claim Bound where its class allows")
    assert world.get(b, "later")["status"]["nodeName"] == allowed
    # The tenant's value was read and forgotten, not followed.
    pod = client.CoreV1Api(api_client).read_namespaced_pod("chooser", b)
    assert (pod.metadata.annotations or {}).get(names.ANNOTATION_SELECTED_NODE) != ruled_out, pod.metadata.annotations


def test_an_edit_tenant_cannot_label_its_namespace_for_node_gpus_or_weigh_its_share(tenants: Tenants) -> None:
    """`elasticgpu.io/node-gpu-access` (the agent passes the namespace's containers untouched) and
    `elasticgpu.io/fair-share-weight` (the controller's bind order) are on the Namespace, which neither
    edit nor admin may write; the node-gpu-access policy refuses even those who may, unless platform."""
    for role in ("edit", "admin"):
        api = tenants.clients[(tenants.b, role)]
        for key in ("elasticgpu.io/node-gpu-access", "elasticgpu.io/fair-share-weight"):
            field, value = ("labels", "true") if key.endswith("access") else ("annotations", "100")
            answer = kube_request(api, "PATCH", f"/api/v1/namespaces/{tenants.b}", headers=MERGE,
                                  body={"metadata": {field: {key: value}}})  # fmt: skip
            assert answer.status == 403, (role, key, answer.body[:300])
