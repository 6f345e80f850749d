"""The Helm chart deploy/chart: Helm lints it, the plain manifests of deploy/ are what it renders,
its switches (cert-manager, ServiceMonitor, default class, namespace, image) do what they say, and
the API server accepts every object it renders of the kinds the test API server serves.

Helm here is Helm itself (the `helm-python-sdk` package: Helm's engine compiled into a library), not
a re-implementation: the same templates `helm install` renders.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python
import pytest
import yaml
from kubernetes import client

from elasticgpu import after_uninstall
from elasticgpu.cli import build_parser, health_address
from elasticgpu.controller.admission import WebhookSettings
from elasticgpu.controller.admission.commands import settings_from
from elasticgpu.controller.admission.configuration import webhook_configuration
from elasticgpu.flags import BindAddress
from tests.kube_cluster import kube_request

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "chart"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_manifests", REPO / "scripts" / "render-manifests.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render_manifests = _script()


def _render(
    values: dict[str, Any] | None = None, *, namespace: str = "elasticgpu-system", chart_dir: Path = CHART
) -> dict[str, list[dict[str, Any]]]:
    """template name -> its objects, as `helm install -n NAMESPACE` would create them."""
    chart = helm_python.Chart.load(chart_dir)
    try:
        rendered = chart.render(values or {}, name="elasticgpu", namespace=namespace)
    finally:
        chart.close()
    return {
        template.split("/templates/", 1)[1]: [doc for doc in yaml.safe_load_all(text) if doc]
        for template, text in rendered.items()
        if template.endswith(".yaml")
    }


def _objects(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    return [doc for docs in _render(values, **kwargs).values() for doc in docs]


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for doc in objects if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def _containers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for doc in objects
        if doc["kind"] in ("Deployment", "DaemonSet", "Job")
        for c in doc["spec"]["template"]["spec"]["containers"]
    ]


CERT_MANAGER = {"webhook": {"certificates": "cert-manager"}}
CRI_PROXY = {"agent": {"nodeHook": "cri-proxy"}}


@pytest.mark.parametrize(
    "values",
    [{}, CERT_MANAGER, {"metrics": {"serviceMonitor": {"enabled": True}}}, {"namespace": {"create": True}}, CRI_PROXY],
    ids=["defaults", "cert-manager", "service-monitor", "plain", "cri-proxy"],
)
def test_helm_lints_the_chart(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, values, strict=True, namespace="elasticgpu-system", kube_version="v1.31.0")
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_the_chart_states_its_minimum_kubernetes_version() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        assert chart.metadata["kubeVersion"] == ">=1.31.0-0"
    finally:
        chart.close()
    assert "Kubernetes 1.31" in (REPO / "README.md").read_text()


def test_the_plain_manifests_are_the_chart_rendered() -> None:
    """deploy/*.yaml and deploy/policies/*.yaml, comment lines aside, are exactly what the chart renders
    (scripts/render-manifests.py rewrites them); no plain file is left that the chart does not render."""
    rendered = render_manifests.render()
    committed = render_manifests.plain_manifests()
    assert sorted(rendered) == committed, "run scripts/render-manifests.py (files it would write or not write)"
    differ = [
        str(path.relative_to(REPO))
        for path in committed
        if render_manifests.significant(path.read_text()) != render_manifests.significant(rendered[path])
    ]
    assert not differ, f"{differ}: differ from deploy/chart; run scripts/render-manifests.py"
    # The policies come back as they are: the chart reads deploy/policies/ (files/policies links there).
    for path in (REPO / "deploy" / "policies").glob("*.yaml"):
        assert rendered[path] == path.read_text()


def test_the_comparison_sees_a_changed_field(tmp_path: Path) -> None:
    """The comparison ignores comment lines only: a changed value is a difference."""
    text = (REPO / "deploy" / "controller.yaml").read_text()
    assert render_manifests.significant(text) == render_manifests.significant("# a new comment\n" + text)
    assert render_manifests.significant(text) != render_manifests.significant(
        text.replace("replicas: 2", "replicas: 3")
    )


def test_the_chart_crds_are_the_projects() -> None:
    chart = helm_python.Chart.load(CHART)
    try:
        crds = {crd["filename"].rsplit("/", 1)[-1]: crd["data"] for crd in chart.crds}
    finally:
        chart.close()
    assert crds == {path.name: path.read_text() for path in (REPO / "crds").glob("*.yaml")}


def test_the_webhook_makes_its_own_certificate_by_default() -> None:
    objects = _objects()
    assert not [doc for doc in objects if doc["kind"] in ("Certificate", "Issuer", "MutatingWebhookConfiguration")]
    (container,) = [c for c in _containers(objects) if c["name"] == "webhook"]
    settings = settings_from(build_parser().parse_args(container["args"]))
    probes = BindAddress(host="0.0.0.0", port=8081)
    assert settings == dataclasses.replace(WebhookSettings(), health_probe_bind_address=probes,
                                           metrics_bind_address=probes)


def test_the_webhook_is_probed_and_scraped_over_its_plain_http_port() -> None:
    objects = _objects()
    (container,) = [c for c in _containers(objects) if c["name"] == "webhook"]
    settings = settings_from(build_parser().parse_args(container["args"]))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.health_probe_bind_address is not None
    assert ports["http-metrics"] == settings.health_probe_bind_address.port
    assert settings.metrics_bind_address == settings.health_probe_bind_address  # one server
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-metrics"}
    service = _one(objects, "Service", "elasticgpu-webhook-metrics")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "elasticgpu",
                                           "app.kubernetes.io/component": "webhook"}
    assert service["metadata"]["labels"]["app.kubernetes.io/component"] == "metrics"  # the ServiceMonitor's
    assert service["spec"]["ports"][0]["targetPort"] == "http-metrics"


def test_cert_manager_renders_a_certificate_and_the_configuration_to_inject() -> None:
    objects = _objects(CERT_MANAGER)
    settings = WebhookSettings()
    certificate = _one(objects, "Certificate", "elasticgpu-webhook")
    assert certificate["spec"]["issuerRef"] == {"name": "elasticgpu-selfsigned", "kind": "Issuer"}
    assert _one(objects, "Issuer", "elasticgpu-selfsigned")["spec"] == {"selfSigned": {}}
    assert set(certificate["spec"]["dnsNames"]) <= set(settings.certificate_hosts())
    assert settings.client_host in certificate["spec"]["dnsNames"]
    # The configuration is the one the webhook publishes itself, but for the caBundle cert-manager injects.
    configuration = _one(objects, "MutatingWebhookConfiguration", settings.configuration_name)
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{settings.namespace}/{certificate['metadata']['name']}"
    }
    published = webhook_configuration(settings, b"")
    for hook in published["webhooks"]:
        del hook["clientConfig"]["caBundle"]
    assert configuration["webhooks"] == published["webhooks"]
    assert configuration["metadata"]["labels"] == published["metadata"]["labels"]
    # No self-signed path: no Secret of the webhook's own, no rights to write it or the configuration,
    # no uninstall hook for a configuration that is now the release's own.
    text = yaml.safe_dump_all(objects)
    assert settings.secret_name not in text
    assert not [
        doc for doc in objects if doc["kind"] in ("Role", "ClusterRole") and "webhook" in doc["metadata"]["name"]
    ]
    assert settings.configuration_name not in yaml.safe_dump_all(
        [doc for doc in objects if "helm.sh/hook" in doc["metadata"].get("annotations", {})])
    # The pods mount the Certificate's Secret.
    deployment = _one(objects, "Deployment", "elasticgpu-webhook")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"secretName": certificate["spec"]["secretName"]} in [v.get("secret") for v in volumes]
    # An issuer of one's own replaces the chart's.
    own = {"name": "corp-ca", "kind": "ClusterIssuer"}
    objects = _objects({"webhook": {"certificates": "cert-manager", "certManager": {"issuerRef": own}}})
    assert _one(objects, "Certificate", "elasticgpu-webhook")["spec"]["issuerRef"] == own
    assert not [doc for doc in objects if doc["kind"] == "Issuer"]


def test_the_cert_manager_webhook_serves_the_mounted_certificate() -> None:
    (container,) = [c for c in _containers(_objects(CERT_MANAGER)) if c["name"] == "webhook"]
    settings = settings_from(build_parser().parse_args(container["args"]))
    assert settings.cert_dir in {mount["mountPath"] for mount in container["volumeMounts"]}


def test_an_unknown_certificates_value_is_refused_by_name() -> None:
    with pytest.raises(
        helm_python.HelmError, match=re.escape('webhook.certificates is "vault": use self-signed or cert-manager')
    ):
        _render({"webhook": {"certificates": "vault"}})


def test_helm_uninstall_removes_what_the_product_made_at_run_time() -> None:
    rendered = _render()
    hook = rendered["helm-uninstall-cleanup.yaml"]
    job = _one(hook, "Job", "elasticgpu-uninstall-cleanup")
    assert all(doc["metadata"]["annotations"]["helm.sh/hook"] == "post-delete" for doc in hook)
    # The names it deletes are the ones the webhook and the controller make, and its rules allow exactly those.
    leftovers = after_uninstall.Leftovers(namespace="elasticgpu-system")
    assert leftovers.webhook_configuration == WebhookSettings().configuration_name
    assert leftovers.webhook_secret == WebhookSettings().secret_name
    assert leftovers.leader_lease == build_parser().parse_args(["controller"]).leader_elect_name
    (webhooks, custom) = _one(hook, "ClusterRole", "elasticgpu-uninstall-cleanup")["rules"]
    assert webhooks == {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                        "resourceNames": [leftovers.webhook_configuration], "verbs": ["delete"]}  # fmt: skip
    assert custom["resources"] == list(after_uninstall.FINALIZED_PLURALS)
    (secrets, leases) = _one(hook, "Role", "elasticgpu-uninstall-cleanup")["rules"]
    assert secrets["resourceNames"] == [leftovers.webhook_secret] and secrets["verbs"] == ["delete"]
    assert leases["resourceNames"] == [leftovers.leader_lease] and leases["verbs"] == ["delete"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    arguments = build_parser().parse_args(container["command"][1:])
    assert container["command"][0] == "elasticgpu" and arguments.handler is after_uninstall.run
    assert arguments.namespace == "elasticgpu-system"
    # With cert-manager the configuration and the Secret are the release's: the hook leaves them to helm.
    cert_managed = _render(CERT_MANAGER)["helm-uninstall-cleanup.yaml"]
    (only,) = _one(cert_managed, "ClusterRole", "elasticgpu-uninstall-cleanup")["rules"]
    assert only["resources"] == list(after_uninstall.FINALIZED_PLURALS)
    (container,) = _one(cert_managed, "Job", "elasticgpu-uninstall-cleanup")["spec"]["template"]["spec"]["containers"]
    arguments = build_parser().parse_args(container["command"][1:])
    assert (arguments.webhook_configuration, arguments.webhook_secret) == ("", "")
    # Its rights go even when the Job fails (a ClusterRole that patches every claim must not outlive it); the
    # failed Job stays for its logs until the next hook replaces it.
    for doc in hook:
        policy = set(doc["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(","))
        wanted = {"before-hook-creation", "hook-succeeded"} | ({"hook-failed"} if doc["kind"] != "Job" else set())
        assert policy == wanted, (doc["kind"], policy)
    # Off with uninstall.cleanup=false.
    assert not _render({"uninstall": {"cleanup": False}}).get("helm-uninstall-cleanup.yaml")
    # Helm only: no plain manifest carries a hook.
    assert not [p for p, text in render_manifests.render().items() if "helm.sh/hook" in text]


def test_the_service_monitor_is_off_by_default_and_scrapes_the_metrics_services() -> None:
    assert not [doc for doc in _objects() if doc["kind"] == "ServiceMonitor"]
    objects = _objects({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    monitor = _one(objects, "ServiceMonitor", "elasticgpu")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [
        doc
        for doc in objects
        if doc["kind"] == "Service" and selector.items() <= doc["metadata"].get("labels", {}).items()
    ]
    assert {s["metadata"]["name"] for s in services} == {
        "elasticgpu-controller-metrics", "elasticgpu-webhook-metrics", "elasticgpu-agent-metrics"}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert all(endpoint["port"] in [p["name"] for p in s["spec"]["ports"]] for s in services)
    # The controller's Service reaches the port /metrics is served on.
    controller = _one(objects, "Deployment", "elasticgpu-controller")
    args = build_parser().parse_args(controller["spec"]["template"]["spec"]["containers"][0]["args"])
    service = _one(objects, "Service", "elasticgpu-controller-metrics")
    assert service["spec"]["ports"][0]["port"] == health_address(args).port
    assert service["spec"]["selector"].items() <= controller["spec"]["template"]["metadata"]["labels"].items()
    with pytest.raises(helm_python.HelmError, match=re.escape("needs metrics.service")):
        _render({"metrics": {"service": False, "serviceMonitor": {"enabled": True}}})


def test_network_policies_admit_only_the_scrapers_to_metrics_and_anyone_to_the_webhook() -> None:
    """/metrics carries per-namespace figures (issue 44): by default only Prometheus of the namespace monitoring
    reaches the metrics ports of the controller, the webhook and the agent; the webhook's HTTPS port admits any
    source (the API server); no other port of those pods admits anything. A switch, and peers of one's own."""
    objects = _objects()
    policies = {doc["metadata"]["name"]: doc["spec"] for doc in objects if doc["kind"] == "NetworkPolicy"}
    assert set(policies) == {"elasticgpu-controller", "elasticgpu-webhook", "elasticgpu-agent"}
    default_from = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                     "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]  # fmt: skip
    for name, spec in policies.items():
        assert spec["policyTypes"] == ["Ingress"], name
        # Each policy selects exactly the pods of its workload (the labels of its pod template).
        (workload,) = [doc for doc in objects if doc["kind"] in ("Deployment", "DaemonSet") and all(
            doc["spec"]["template"]["metadata"]["labels"].get(k) == v
            for k, v in spec["podSelector"]["matchLabels"].items())]  # fmt: skip
        ports = {port["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"]
                 for port in c.get("ports", [])}  # fmt: skip
        open_to_all = {p["port"] for rule in spec["ingress"] if "from" not in rule for p in rule["ports"]}
        scraped = {p["port"] for rule in spec["ingress"] if rule.get("from") == default_from for p in rule["ports"]}
        assert all("from" not in rule or rule["from"] == default_from for rule in spec["ingress"]), name
        if name == "elasticgpu-webhook":
            assert open_to_all == {8443} and scraped == {8081} and ports == {8443, 8081}
        else:
            assert open_to_all == set() and scraped == ports and scraped, (name, ports)
    mine = [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    (agent,) = [doc for doc in _objects({"networkPolicy": {"metricsFrom": mine}})
                if doc["kind"] == "NetworkPolicy" and doc["metadata"]["name"] == "elasticgpu-agent"]
    assert agent["spec"]["ingress"] == [{"from": mine, "ports": [{"port": 9410, "protocol": "TCP"}]}]
    assert not [doc for doc in _objects({"networkPolicy": {"enabled": False}}) if doc["kind"] == "NetworkPolicy"]


def test_the_default_class_is_a_switch() -> None:
    (default,) = [doc for doc in _objects() if doc["kind"] == "ElasticGPUClass"]
    assert default["metadata"]["annotations"]["elasticgpu.io/is-default-class"] == "true"
    assert not [doc for doc in _objects({"defaultClass": {"enabled": False}}) if doc["kind"] == "ElasticGPUClass"]


AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def _granted(role: dict[str, Any]) -> set[tuple[str, str]]:
    return {(resource, verb) for rule in role["rules"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_claims_are_aggregated_into_edit_and_reads_into_view_and_nothing_else_is_written() -> None:
    """Issue 33 item 2: the built-in roles take in the claims as they take in PVCs; a tenant never gets
    the status subresource or a write of the platform's kinds (docs/security.md); both are switches."""
    objects = _objects()
    view, edit = _one(objects, "ClusterRole", "elasticgpu-view"), _one(objects, "ClusterRole", "elasticgpu-edit")
    assert {k for k, v in view["metadata"]["labels"].items() if v == "true"} == {
        f"{AGGREGATE}view", f"{AGGREGATE}edit", f"{AGGREGATE}admin"}
    assert {k for k, v in edit["metadata"]["labels"].items() if v == "true"} == {
        f"{AGGREGATE}edit", f"{AGGREGATE}admin"}
    assert {verb for _, verb in _granted(view)} == {"get", "list", "watch"}
    assert {r for r, _ in _granted(view)} >= {"elasticgpuclaims", "elasticgpuclasses", "elasticgpuquotas", "gpus"}
    assert _granted(edit) == {("elasticgpuclaims", v) for v in ("create", "update", "patch", "delete",
                                                                "deletecollection")}
    assert all(rule["apiGroups"] == ["elasticgpu.io"] for role in (view, edit) for rule in role["rules"])
    reader = _one(objects, "ClusterRoleBinding", "elasticgpu-class-reader")
    assert [s["name"] for s in reader["subjects"]] == ["system:authenticated"]
    assert _granted(_one(objects, "ClusterRole", "elasticgpu-class-reader")) == {
        ("elasticgpuclasses", v) for v in ("get", "list", "watch")}
    off = _objects({"rbac": {"aggregateToDefaultRoles": False, "classesReadableByAll": False}})
    assert not [d for d in off if d["metadata"]["name"].startswith(("elasticgpu-view", "elasticgpu-edit",
                                                                    "elasticgpu-class-reader"))]


def test_image_namespace_and_replicas_come_from_the_values() -> None:
    values = {
        "image": {"repository": "registry.example/egpu", "tag": "9.9.9", "pullPolicy": "Always"},
        "namespace": {"name": "gpu-infra"},
        "controller": {"replicas": 3},
        "webhook": {"replicas": 4},
    }
    objects = _objects(values, namespace="ignored-by-the-value")
    assert {(c["image"], c["imagePullPolicy"]) for c in _containers(objects)} == {
        ("registry.example/egpu:9.9.9", "Always")
    }
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ElasticGPUClass",
        "MutatingWebhookConfiguration",
    }
    assert {doc["metadata"].get("namespace") for doc in objects if doc["kind"] not in cluster_scoped} == {"gpu-infra"}
    subjects = [s for doc in objects if doc["kind"] in ("RoleBinding", "ClusterRoleBinding") for s in doc["subjects"]
                if s["kind"] == "ServiceAccount"]  # the class reader's Group (system:authenticated) has none
    assert {s["namespace"] for s in subjects} == {"gpu-infra"}
    # The policies judge the agent's ServiceAccount of that namespace.
    policies = [
        doc for doc in objects if doc["kind"] == "ValidatingAdmissionPolicy" and doc["spec"].get("matchConditions")
    ]
    assert policies and all(
        "system:serviceaccount:gpu-infra:elasticgpu-agent" in c["expression"]
        for p in policies
        for c in p["spec"]["matchConditions"]
    )
    (webhook,) = [c for c in _containers(objects) if c["name"] == "webhook"]
    assert settings_from(build_parser().parse_args(webhook["args"])).namespace == "gpu-infra"
    assert _one(objects, "Deployment", "elasticgpu-controller")["spec"]["replicas"] == 3
    assert _one(objects, "Deployment", "elasticgpu-webhook")["spec"]["replicas"] == 4
    # The release's namespace is the default; helm makes it (--create-namespace), the chart does not.
    objects = _objects(namespace="elasticgpu-system")
    assert not [doc for doc in objects if doc["kind"] == "Namespace"]
    assert _one(objects, "Deployment", "elasticgpu-controller")["metadata"]["namespace"] == "elasticgpu-system"


def test_one_controller_replica_may_run_without_election_two_may_not() -> None:
    objects = _objects({"controller": {"replicas": 1, "leaderElect": False}})
    (container,) = [c for c in _containers(objects) if c["name"] == "controller"]
    assert not build_parser().parse_args(container["args"]).leader_elect
    with pytest.raises(helm_python.HelmError, match=re.escape("needs controller.leaderElect")):
        _render({"controller": {"leaderElect": False}})


def test_the_agent_installer_runs_on_gpu_nodes_and_never_as_the_agent(tmp_path: Path) -> None:
    # The installer is the CRI proxy's (agent.nodeHook=cri-proxy); the default, NRI, runs the agent as a
    # DaemonSet pod instead (tests/deploy/test_agent_daemonset.py).
    assert not [d for d in _objects() if d["metadata"]["name"] == "elasticgpu-agent-installer"]
    objects = _objects(CRI_PROXY)
    daemonset = _one(objects, "DaemonSet", "elasticgpu-agent-installer")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"elasticgpu.io/agent": "true"}  # nodes opt in (issue 46)
    assert pod["hostPID"] and pod["containers"][0]["securityContext"]["privileged"]
    assert pod["automountServiceAccountToken"] is False
    config = _one(objects, "ConfigMap", "elasticgpu-agent-installer")["data"]
    # The units it installs are deploy/elasticgpu-agent.service and deploy/elasticgpu-mps.service as they are.
    for unit in ("elasticgpu-agent.service", "elasticgpu-mps.service"):
        assert config[unit] == (REPO / "deploy" / unit).read_text()
    # Each file it installs is in the pods' checksum: a change to any of them rolls the pods.
    annotation = daemonset["spec"]["template"]["metadata"]["annotations"]["elasticgpu.io/installer-files"]
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)  # links followed: files/ holds the units' text
    (copy / "files" / "elasticgpu-mps.service").write_text(config["elasticgpu-mps.service"] + "# changed\n")
    other = _one(_objects(CRI_PROXY, chart_dir=copy), "DaemonSet", "elasticgpu-agent-installer")
    assert other["spec"]["template"]["metadata"]["annotations"]["elasticgpu.io/installer-files"] != annotation
    assert "kubelet" not in [
        w
        for line in config["install-agent.sh"].splitlines()
        if "systemctl_host" in line and not line.lstrip().startswith("#")
        for w in line.split()
    ]
    # Helm merges maps: null drops the default label.
    objects = _objects(
        {
            "agent": {
                "nodeHook": "cri-proxy",
                "installer": {"nodeSelector": {"pool": "gpu", "elasticgpu.io/agent": None}},
                "env": {"ELASTICGPU_AGENT_CRI_UPSTREAM": "unix:///run/crio/crio.sock"},
            }
        }
    )
    assert _one(objects, "DaemonSet", "elasticgpu-agent-installer")["spec"]["template"]["spec"]["nodeSelector"] == {
        "pool": "gpu"
    }
    env = _one(objects, "ConfigMap", "elasticgpu-agent-installer")["data"]["agent.env"]
    # The chart's own line lets its installer through the agent (issue 23.2, tests/agent/cri/test_installer_pods.py).
    assert env == ("ELASTICGPU_AGENT_CRI_UPSTREAM=unix:///run/crio/crio.sock\n"
                   "ELASTICGPU_AGENT_PRIVILEGED_PODS=elasticgpu-system/app.kubernetes.io/component=agent-installer\n")


# --- The API server's word -------------------------------------------------------------------------


def _served(api: client.ApiClient) -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) -> (resource, namespaced) for everything the server serves."""
    served: dict[tuple[str, str], tuple[str, bool]] = {}
    versions = ["v1"] + [
        v["groupVersion"] for g in kube_request(api, "GET", "/apis").json()["groups"] for v in g["versions"]
    ]
    for version in versions:
        answer = kube_request(api, "GET", "/api/v1" if version == "v1" else f"/apis/{version}")
        if answer.status != 200:
            continue
        for resource in answer.json()["resources"]:
            if "/" not in resource["name"]:
                served[version, resource["kind"]] = (resource["name"], resource["namespaced"])
    return served


@pytest.mark.parametrize(
    "values",
    [
        {"namespace": {"create": True}},
        {**CERT_MANAGER, "namespace": {"create": True}, "metrics": {"serviceMonitor": {"enabled": True}}},
    ],
    ids=["plain", "switches"],
)
def test_the_api_server_accepts_what_the_chart_renders(
    api_client: client.ApiClient, crds_installed: list[str], namespace: str, values: dict[str, Any]
) -> None:
    """Server-side apply, dry run, of every object of a kind the server serves (the CRDs first, as helm
    installs crds/ before the templates); the rest is listed, so a server that serves more checks more."""
    served = _served(api_client)
    chart = helm_python.Chart.load(CHART)
    try:
        crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
    finally:
        chart.close()
    objects = crds + _objects({**values, "namespace": {**values["namespace"], "name": namespace}})
    checked, skipped = set(), set()
    for doc in objects:
        key = (doc["apiVersion"], doc["kind"])
        if key not in served:
            skipped.add(key)
            continue
        resource, namespaced = served[key]
        base = "/api/v1" if doc["apiVersion"] == "v1" else f"/apis/{doc['apiVersion']}"
        where = f"/namespaces/{doc['metadata']['namespace']}" if namespaced else ""
        path = f"{base}{where}/{resource}/{doc['metadata']['name']}"
        answer = kube_request(
            api_client,
            "PATCH",
            path,
            body=doc,
            headers={"Content-Type": "application/apply-patch+yaml"},
            query=[("fieldManager", "chart-test"), ("force", "true"), ("dryRun", "All"), ("fieldValidation", "Strict")],
        )
        assert answer.status in (200, 201), (
            f"{doc['kind']} {doc['metadata']['name']}: HTTP {answer.status}: {answer.body[:1500]!r}"
        )
        checked.add(doc["kind"])
    must = {
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ElasticGPUClass",
    }
    if "webhook" in values:
        must.add("MutatingWebhookConfiguration")
    assert must <= checked, (checked, skipped)
    print(f"checked by the API server: {sorted(checked)}; not served here: {sorted(k for _, k in skipped)}")
