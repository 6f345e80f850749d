"""The RBAC evaluator of tests/deploy/rbac.py decides as kube-apiserver's RBAC authorizer does, so
that test_rbac.py can fail: requests turned into attributes, rules matched by group, resource,
verb, name and namespace."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.rbac import Permissions, Request, request_of

SA = [{"kind": "ServiceAccount", "name": "robot", "namespace": "sys"}]


def _permissions(tmp_path: Path, *docs: dict[str, object]) -> Permissions:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return Permissions.of([path], "sys", "robot")


def _cluster_role(rules: list[dict[str, object]]) -> tuple[dict[str, object], dict[str, object]]:
    role = {"kind": "ClusterRole", "metadata": {"name": "r"}, "rules": rules}
    binding = {"kind": "ClusterRoleBinding", "metadata": {"name": "b"}, "subjects": SA,
               "roleRef": {"kind": "ClusterRole", "name": "r"}}  # fmt: skip
    return role, binding


@pytest.mark.parametrize(
    ("verb", "path", "expected"),
    [
        ("list", "/api/v1/pods?labelSelector=a%3Db", Request("list", "", "pods", None, None)),
        ("watch", "/api/v1/namespaces/n/pods?watch=true", Request("watch", "", "pods", "n", None)),
        ("patch", "/api/v1/namespaces/n/pods/p/status", Request("patch", "", "pods/status", "n", "p")),
        ("update", "/apis/elasticgpu.io/v1alpha1/gpus/g/status", Request("update", "elasticgpu.io", "gpus/status",
                                                                         None, "g")),
        ("get", "/api/v1/namespaces/n", Request("get", "", "namespaces", None, "n")),
        ("get", "/version", None),
        ("get", "/apis/elasticgpu.io/v1alpha1", None),
    ],
)  # fmt: skip
def test_requests_become_rbac_attributes(verb: str, path: str, expected: Request | None) -> None:
    assert request_of(verb, path) == expected


def test_a_missing_verb_or_subresource_is_denied(tmp_path: Path) -> None:
    permissions = _permissions(tmp_path, *_cluster_role([{"apiGroups": [""], "resources": ["pods"],
                                                          "verbs": ["get", "list"]}]))  # fmt: skip
    seen = {
        ("list", "/api/v1/pods"),
        ("patch", "/api/v1/namespaces/n/pods/p"),
        ("patch", "/api/v1/namespaces/n/pods/p/status"),
        ("get", "/apis/apps/v1/namespaces/n/deployments/d"),
    }
    denied = permissions.denied(seen)
    assert len(denied) == 3 and all(not d.startswith("list core/pods") for d in denied), denied


def test_resource_names_never_allow_create_list_or_watch(tmp_path: Path) -> None:
    rule = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["l"],
            "verbs": ["create", "get", "list", "update"]}  # fmt: skip
    permissions = _permissions(tmp_path, *_cluster_role([rule]))
    allowed = {verb for verb in ("create", "get", "list", "update")
               if permissions.allows(Request(verb, "coordination.k8s.io", "leases", "x", "l" if verb in
                                             ("get", "update") else None))}  # fmt: skip
    assert allowed == {"get", "update"}
    assert not permissions.allows(Request("get", "coordination.k8s.io", "leases", "x", "other"))


def test_a_role_holds_only_in_its_namespace_and_only_for_its_subjects(tmp_path: Path) -> None:
    role = {
        "kind": "Role",
        "metadata": {"name": "r", "namespace": "sys"},
        "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}],
    }
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "b", "namespace": "sys"},
        "subjects": SA,
        "roleRef": {"kind": "Role", "name": "r"},
    }
    other = {"kind": "RoleBinding", "metadata": {"name": "o", "namespace": "elsewhere"},
             "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": "sys"}],
             "roleRef": {"kind": "Role", "name": "r"}}  # fmt: skip
    permissions = _permissions(tmp_path, role, binding, other)
    assert permissions.allows(Request("create", "", "events", "sys", None))
    assert not permissions.allows(Request("create", "", "events", "default", None))


def test_a_binding_to_a_missing_role_is_an_error(tmp_path: Path) -> None:
    _, binding = _cluster_role([])
    with pytest.raises(AssertionError, match="missing ClusterRole r"):
        _permissions(tmp_path, binding)
