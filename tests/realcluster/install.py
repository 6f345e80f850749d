"""Installing the product's manifests on the real control plane as a user does (server-side apply of
deploy/*.yaml, deploy/agent-kubeconfig.sh for a node's agent)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.kube_cluster import TestCluster, server_side_apply

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def manifest_path(doc: dict[str, Any]) -> str:
    """The REST path of a manifest document (the kinds deploy/agent.yaml and the policies hold)."""
    kind, name = doc["kind"], doc["metadata"]["name"]
    plural = {"Namespace": "namespaces", "ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
              "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings",
              "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
              "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings"}[kind]  # fmt: skip
    group = doc["apiVersion"]
    base = "/api/v1" if group == "v1" else f"/apis/{group}"
    namespace = doc["metadata"].get("namespace")
    return f"{base}/namespaces/{namespace}/{plural}/{name}" if namespace else f"{base}/{plural}/{name}"


IDENTITY_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
"""What of a component's manifest a test applies when it runs the component as a process here (the
Deployment, Service and PodDisruptionBudget stay out: no pod of the product runs on this cluster)."""


def apply_file(api: client.ApiClient, path: Path, kinds: tuple[str, ...] | None = None) -> None:
    """Server-side apply of every document of a manifest file (only `kinds` when given), as the admin."""
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and (kinds is None or doc["kind"] in kinds):
            server_side_apply(api, manifest_path(doc), doc)


def service_account_kubeconfig(cluster: TestCluster, account: str, namespace: str, directory: Path) -> Path:
    """A kubeconfig with a token of `namespace/account` (`kubectl create token`, 1 h): the identity
    the chart's Deployment gives that component, with the chart's RBAC and nothing wider."""
    assert cluster.kubectl is not None, "kubectl not found (testserver/build.sh unpacks one)"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    token = subprocess.run([str(cluster.kubectl), "create", "token", account, "-n", namespace, "--duration", "1h"],
                           env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()  # fmt: skip
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    out = directory / f"{account}.kubeconfig"
    out.write_text(yaml.safe_dump(config))
    out.chmod(0o600)
    return out


def agent_kubeconfig(cluster: TestCluster, node: str, directory: Path) -> Path:
    """deploy/agent-kubeconfig.sh NODE FILE, run as the admin with the build's kubectl."""
    assert cluster.kubectl is not None, "kubectl not found (testserver/build.sh unpacks one)"
    out = directory / f"agent-{node}.kubeconfig"
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "KUBECTL": str(cluster.kubectl)}
    done = subprocess.run(["bash", str(DEPLOY / "agent-kubeconfig.sh"), node, str(out)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out
