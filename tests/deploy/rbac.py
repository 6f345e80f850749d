"""What Kubernetes RBAC would decide for the requests a component made, from the manifests in deploy/.

The test API server authorizes everything, so a missing permission would only show in a real
cluster, as a 403 the component retries forever. Here a request (verb and path, as the recording
proxy saw it) is turned into the attributes kube-apiserver's RequestInfo derives (API group,
resource, subresource, namespace, name) and matched against the Roles and ClusterRoles the
manifests bind to a ServiceAccount, with RBAC's rules: a ClusterRole through a
ClusterRoleBinding holds everywhere, a Role only in its namespace; `resourceNames` never match a
create, a list or a watch; `*` matches anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

DISCOVERY_PREFIXES = ("/version", "/openapi", "/healthz", "/livez", "/readyz")
"""Non-resource paths every authenticated user may read (the default ClusterRoles
system:discovery and system:public-info-viewer)."""


@dataclass(frozen=True)
class Request:
    """A resource request's RBAC attributes."""

    verb: str
    group: str
    resource: str  # "pods", or "pods/status" with its subresource
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{named}{where}"


def request_of(verb: str, path: str) -> Request | None:
    """The attributes of one request (`path` with its query), None for a discovery path."""
    url = urlsplit(path)
    parts = [p for p in url.path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        if url.path.startswith(DISCOVERY_PREFIXES) or parts[:1] in (["api"], ["apis"]):
            return None
        raise ValueError(f"not a Kubernetes API path: {path}")
    if not rest:
        return None  # /api/v1, /apis/group/version: discovery
    if rest[0] == "watch":
        rest = rest[1:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    if verb in ("get", "list") and name is None:
        verb = "watch" if parse_qs(url.query).get("watch", ["false"])[0] in ("true", "1") else "list"
    return Request(verb, group, resource, namespace, name)


@dataclass(frozen=True)
class Rule:
    groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    names: frozenset[str]
    namespace: str | None  # a Role's namespace; None: everywhere (ClusterRole via ClusterRoleBinding)

    def allows(self, request: Request) -> bool:
        if self.namespace is not None and request.namespace != self.namespace:
            return False
        if not (self.groups & {"*", request.group}):
            return False
        if not (self.resources & {"*", request.resource}):
            return False
        if not (self.verbs & {"*", request.verb}):
            return False
        if self.names:
            # resourceNames cannot restrict a create (no name yet) nor a list or a watch.
            return request.verb not in ("create", "list", "watch") and request.name in self.names
        return True


class Permissions:
    """The rules the manifests grant one ServiceAccount."""

    def __init__(self, rules: Sequence[Rule], subject: str) -> None:
        self.rules, self.subject = rules, subject

    @classmethod
    def of(cls, manifests: Iterable[Path], namespace: str, service_account: str) -> Permissions:
        docs = [doc for path in manifests for doc in yaml.safe_load_all(path.read_text()) if doc]
        roles = {(doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]): doc
                 for doc in docs if doc["kind"] in ("Role", "ClusterRole")}  # fmt: skip
        rules: list[Rule] = []
        for binding in (doc for doc in docs if doc["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if not any(_is_subject(s, namespace, service_account) for s in binding.get("subjects") or []):
                continue
            ref = binding["roleRef"]
            scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
            role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"]))
            if role is None:
                raise AssertionError(f"{binding['kind']} {binding['metadata']['name']} refers to a missing "
                                     f"{ref['kind']} {ref['name']}")  # fmt: skip
            rules.extend(_rules(role.get("rules") or [], scope))
        return cls(rules, f"system:serviceaccount:{namespace}:{service_account}")

    def allows(self, request: Request) -> bool:
        return any(rule.allows(request) for rule in self.rules)

    def denied(self, seen: Iterable[tuple[str, str]]) -> list[str]:
        """Each request of `seen` (verb, path) these rules would refuse, as text, sorted."""
        refused = set()
        for verb, path in seen:
            request = request_of(verb, path)
            if request is not None and not self.allows(request):
                refused.add(f"{request}  ({verb} {path})")
        return sorted(refused)


def _is_subject(subject: dict[str, Any], namespace: str, service_account: str) -> bool:
    return (subject.get("kind") == "ServiceAccount" and subject.get("name") == service_account
            and subject.get("namespace") == namespace)  # fmt: skip


def _rules(rules: list[dict[str, Any]], namespace: str | None) -> list[Rule]:
    return [Rule(frozenset(r.get("apiGroups") or []), frozenset(r.get("resources") or []),
                 frozenset(r.get("verbs") or []), frozenset(r.get("resourceNames") or []), namespace)
            for r in rules]  # fmt: skip
