"""deploy/controller.yaml, deploy/agent.yaml, deploy/elasticgpu-agent.service and deploy/elasticgpu-mps.service
agree with the programs they run: arguments the command lines accept, the ports and probe paths the controller
serves, ServiceAccounts that exist and are bound (and judged by deploy/policies), a kubeconfig
script that binds each node's token to its Node, unit files systemd accepts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from elasticgpu.agent import kube as agent_kube
from elasticgpu.agent import mps_serving
from elasticgpu.agent import settings as agent_settings
from elasticgpu.cli import build_parser, health_address

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _objects(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc]
    return {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}


def test_the_controller_deployment_runs_what_the_controller_serves() -> None:
    objects = _objects("controller.yaml")
    deployment = objects["Deployment", "elasticgpu-controller"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.command == "controller" and args.leader_elect, "two replicas need leader election"
    port = {p["name"]: p["containerPort"] for p in container["ports"]}[container["livenessProbe"]["httpGet"]["port"]]
    assert port == health_address(args).port
    assert (container["livenessProbe"]["httpGet"]["path"], container["readinessProbe"]["httpGet"]["path"]) == (
        "/healthz",
        "/readyz",
    )
    # The Lease is written where the pod runs (the Role's namespace, the Role's resource name).
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAMESPACE"] == "metadata.namespace"
    role = objects["Role", "elasticgpu-controller-leader"]
    assert role["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert [args.leader_elect_name] in [r.get("resourceNames") for r in role["rules"]]
    account = pod["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        subjects = next(doc for (k, _), doc in objects.items() if k == kind)["subjects"]
        assert {"kind": "ServiceAccount", "name": account, "namespace": deployment["metadata"]["namespace"]} in subjects
    assert deployment["spec"]["replicas"] >= 2


def test_the_agent_policies_judge_the_bound_service_account() -> None:
    objects = _objects("agent.yaml")
    assert not [key for key in objects if key[0] == "Secret"], "no long-lived token: each node gets a bound one"
    (account,) = [doc for (kind, _), doc in objects.items() if kind == "ServiceAccount"]
    subject = {"kind": "ServiceAccount", "name": account["metadata"]["name"],
               "namespace": account["metadata"]["namespace"]}  # fmt: skip
    assert subject in objects["ClusterRoleBinding", "elasticgpu-agent"]["subjects"]
    user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    policies = _objects("policies/agent-node-scope.yaml")
    judged = [doc for (kind, _), doc in policies.items() if kind == "ValidatingAdmissionPolicy"]
    # GPUs, its Node, claim status, Events, its ResourceSlices (the DRA driver).
    assert len(judged) == 5
    for policy in judged:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{user}'"
        binding = policies["ValidatingAdmissionPolicyBinding", policy["metadata"]["name"]]
        assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}


def test_the_kubeconfig_script_binds_the_token_to_the_node(tmp_path: Path) -> None:
    # kubectl stands in for a cluster that issues tokens (the test API server has no TokenRequest):
    # it records its arguments and answers as kubectl would.
    calls = tmp_path / "calls"
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        '  "get node"*) echo node/gpu-node-1 ;;\n'
        '  "create token"*) echo token-of-gpu-node-1 ;;\n'
        '  *cluster.server*) echo https://203.0.113.7:6443 ;;\n'
        '  *certificate-authority-data*) echo Q0EK ;;\n'
        "esac\n"
    )
    kubectl.chmod(0o755)
    out = tmp_path / "kubeconfig"
    subprocess.run(["bash", str(DEPLOY / "agent-kubeconfig.sh"), "gpu-node-1", str(out)], check=True,
                   env={"PATH": "/usr/bin:/bin", "KUBECTL": str(kubectl)}, timeout=30)  # fmt: skip
    assert calls.read_text().splitlines()[:2] == [
        "get node gpu-node-1 -o name",
        "create token elasticgpu-agent --namespace elasticgpu-system --bound-object-kind Node"
        " --bound-object-name gpu-node-1 --duration 8760h",
    ]
    assert out.stat().st_mode & 0o777 == 0o600
    # The agent reads it as it reads any kubeconfig.
    kube = agent_kube.AgentKube(agent_kube.load_api_client(str(out), None), node_name="gpu-node-1",
                                field_manager="elasticgpu-agent")  # fmt: skip
    try:
        assert kube._api.configuration.host == "https://203.0.113.7:6443"
        # ... and sends the token (the kubernetes package keeps it under "BearerToken").
        assert kube._headers(None)["Authorization"] == "Bearer token-of-gpu-node-1"
    finally:
        kube.close()
    # A node that does not exist gets no token.
    kubectl.write_text('#!/bin/sh\necho "Error from server (NotFound): nodes not found" >&2; exit 1\n')
    failed = subprocess.run(["bash", str(DEPLOY / "agent-kubeconfig.sh"), "nowhere"], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin", "KUBECTL": str(kubectl)}, timeout=30)  # fmt: skip
    assert failed.returncode != 0 and "NotFound" in failed.stderr and not failed.stdout


def _unit(name: str = "elasticgpu-agent.service") -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = ""
    for line in (DEPLOY / name).read_text().splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections[current] = {}
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            sections[current][key] = value
    return sections


def test_the_agent_unit_runs_the_agent_before_kubelet_and_never_gives_up() -> None:
    unit = _unit()
    assert "kubelet.service" in unit["Unit"]["Before"].split()
    assert unit["Unit"]["StartLimitIntervalSec"] == "0" and unit["Service"]["Restart"] == "always"
    # Ready means kubelet's socket serves (service_manager.py); a hung agent is restarted.
    assert unit["Service"]["Type"] == "notify" and int(unit["Service"]["WatchdogSec"]) > 0
    # Wanted, never required, by kubelet: stopping the agent must not stop kubelet.
    assert "RequiredBy" not in unit["Install"] and "kubelet.service" in unit["Install"]["WantedBy"].split()
    # The MPS daemons' unit is wanted and started first, never required or bound: an agent restart
    # leaves it (and the MPS clients) alone.
    assert "elasticgpu-mps.service" in unit["Unit"]["Wants"].split()
    assert "elasticgpu-mps.service" in unit["Unit"]["After"].split()
    assert not {"Requires", "BindsTo", "PartOf", "Requisite"} & unit["Unit"].keys()
    # The command line is one the agent accepts (systemd's $$ is a literal $ for the shell).
    script = shlex.split(unit["Service"]["ExecStart"])[-1].replace("$$", "$")
    words = shlex.split(re.sub(r'"\$\{[^"]*\}"', "node-a", script))
    assert words[:4] == ["exec", "/opt/elasticgpu/bin/python", "-m", "elasticgpu.agent"]
    args = build_parser().parse_args(["agent", *words[4:]])
    settings = agent_settings.from_sources(args, environ=_environment(unit))
    # It asks the MPS service, at the socket that service listens on, rather than run the daemons.
    assert settings.isolation.mps_daemons_socket == str(_mps_socket())
    assert settings.kube.node_name == "node-a" and settings.kube.kubeconfig == "/etc/elasticgpu/kubeconfig"
    # Its state and socket folders are the agent's defaults.
    assert settings.ledger.ledger_url == f"sqlite:////var/lib/{unit['Service']['StateDirectory']}/ledger.db"
    assert settings.cri.cri_listen.startswith(f"/var/run/{unit['Service']['RuntimeDirectory']}/")


def _environment(unit: dict[str, dict[str, str]]) -> dict[str, str]:
    """The unit's Environment= (one assignment each here; agent.env is the site's, absent in these tests)."""
    name, value = unit["Service"]["Environment"].split("=", 1)
    return {name: value}


def _mps_socket() -> Path:
    """Where elasticgpu-mps listens, as its command line and environment make it."""
    unit = _unit("elasticgpu-mps.service")
    script = shlex.split(unit["Service"]["ExecStart"])[-1]
    words = shlex.split(script)
    assert words[:4] == ["exec", "/opt/elasticgpu/bin/python", "-m", "elasticgpu.agent"]
    args = build_parser().parse_args(["agent", *words[4:]])
    assert args.agent_command == "mps-daemons"
    return mps_serving.socket_path(agent_settings.from_sources(args, environ=_environment(unit)))


def test_the_mps_unit_runs_the_daemons_in_a_cgroup_of_their_own_that_outlives_its_own_restart() -> None:
    unit = _unit("elasticgpu-mps.service")
    assert unit["Unit"]["StartLimitIntervalSec"] == "0" and unit["Service"]["Restart"] == "always"
    # A stop or restart of the service ends only its own process: the daemons keep their clients and
    # the next run adopts them (tests/agent/cri/test_mps_service.py).
    assert unit["Service"]["KillMode"] == "process"
    # Tied to nothing: neither the agent's restart nor its stop reaches it.
    assert not {"Requires", "BindsTo", "PartOf", "Requisite"} & unit["Unit"].keys()
    # The same settings as the agent (agent.env), the socket in the agent's runtime folder, root's.
    assert unit["Service"]["EnvironmentFile"] == _unit()["Service"]["EnvironmentFile"]
    socket = _mps_socket()
    assert socket.is_relative_to(f"/var/run/{_unit()['Service']['RuntimeDirectory']}")
    assert unit["Service"]["RuntimeDirectory"] == _unit()["Service"]["RuntimeDirectory"]
    assert "User" not in unit["Service"] and "DynamicUser" not in unit["Service"]
    # The host's mount namespace: the /dev/shm tmpfs it mounts must reach the runtime (docs/isolation.md).
    assert not {"PrivateMounts", "PrivateTmp", "ProtectSystem", "ProtectHome"} & unit["Service"].keys()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", ["elasticgpu-agent.service", "elasticgpu-mps.service"])
def test_systemd_accepts_the_units(name: str) -> None:
    result = subprocess.run(["systemd-analyze", "verify", str(DEPLOY / name)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [line for line in result.stderr.splitlines() if "elasticgpu-" in line]
    assert result.returncode == 0 and not problems, result.stderr
