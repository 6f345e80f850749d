"""`elasticgpu plan` is as strict as the cluster by default (issue 50): a claim the CRD would refuse
at `kubectl apply` is an error (exit 2, one line naming the object and the field), not a Pending
row; and the pods, Deployments and Jobs it is given get the admission webhook's own checks, their
inline requests planned as the claims the controller would make."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticgpu import cli, user_errors

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "plan"
CARDS = ("-f", str(SAMPLE / "nodes.yaml"), "-f", str(SAMPLE / "classes.yaml"))

CLAIM = """\
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: NAME, namespace: team-a}
spec:
  resources:
    requests: REQUESTS
"""


def _plan(capsys: pytest.CaptureFixture[str], *files: Path) -> tuple[int, str, str]:
    argv = ["plan", *CARDS]
    for path in files:
        argv += ["-f", str(path)]
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write(tmp_path: Path, text: str, name: str = "in.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("requests", "field"),
    [
        ("{elasticgpu.io/gpu-core: 150}", "spec.resources.requests[elasticgpu.io/gpu-core]: must be 1..100"),
        ("{gpu-mem: 10Gi}", "gpu-mem"),
        ("{elasticgpu.io/gpu-memory: 0}", "spec.resources.requests[elasticgpu.io/gpu-memory]"),
    ],
    ids=["150-cores", "unknown-key", "no-memory"],
)
def test_a_claim_the_cluster_refuses_is_an_error_without_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], requests: str, field: str) -> None:
    claim = _write(tmp_path, CLAIM.replace("NAME", "bad").replace("REQUESTS", requests))
    code, out, err = _plan(capsys, claim)
    assert code == user_errors.EXIT_USAGE, out
    assert "ElasticGPUClaim bad" in err and field in err
    assert out == ""  # nothing planned from input the cluster would not take


POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: team-a
  annotations: ANNOTATIONS
spec:
  containers:
  - {name: train, image: busybox}
"""


def test_a_pod_naming_a_container_it_lacks_is_refused_as_the_webhook_refuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path, POD.replace("ANNOTATIONS", "{egpuc.elasticgpu.io/trian: notebook}"))
    code, _, err = _plan(capsys, SAMPLE / "claims.yaml", pod)
    assert code == user_errors.EXIT_USAGE
    assert "Pod trainer" in err and "metadata.annotations[egpuc.elasticgpu.io/trian]" in err
    assert "train" in err  # the containers the pod has


def test_a_pod_naming_a_claim_not_in_the_input_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path, POD.replace("ANNOTATIONS", "{egpuc.elasticgpu.io/train: notebok}"))
    code, _, err = _plan(capsys, SAMPLE / "claims.yaml", pod)
    assert code == user_errors.EXIT_USAGE
    assert "Pod trainer" in err and "claim team-a/notebok" in err and "notebook" in err  # what was meant


def test_a_pod_naming_a_claim_of_the_input_plans_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _write(tmp_path, POD.replace("ANNOTATIONS", "{egpuc.elasticgpu.io/train: notebook}"))
    code, out, _ = _plan(capsys, SAMPLE / "claims.yaml", pod)
    assert code == 0
    lines = {line.split()[1]: line for line in out.splitlines()[1:] if line.strip()}
    assert "Bound" in lines["notebook"]


DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: team-a}
spec:
  replicas: 3
  selector: {matchLabels: {app: infer}}
  template:
    metadata:
      labels: {app: infer}
      annotations: {elasticgpu.io/request.server: "REQUEST"}
    spec:
      containers:
      - {name: server, image: busybox}
"""


def test_a_deployment_s_inline_request_is_planned_once_per_replica(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployment = _write(tmp_path, DEPLOYMENT.replace("REQUEST", "gpu-core=30,gpu-memory=10Gi"))
    code, out, _ = _plan(capsys, deployment)
    assert code == 0
    rows = [line for line in out.splitlines()[1:] if "infer" in line]
    assert len(rows) == 3 and all("Bound" in row and "30%" in row for row in rows), out


def test_a_deployment_s_inline_request_the_cluster_refuses_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deployment = _write(tmp_path, DEPLOYMENT.replace("REQUEST", "gpu-core=150"))
    code, out, err = _plan(capsys, deployment)
    assert code == user_errors.EXIT_USAGE, out
    assert "Deployment infer" in err and "elasticgpu.io/request.server" in err


def test_a_deployment_whose_replicas_share_one_claim_gets_a_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A claim serves one pod at a time: replicas naming one claim would wait for each other (not an error)."""
    shared = DEPLOYMENT.replace("elasticgpu.io/request.server: \"REQUEST\"", "egpuc.elasticgpu.io/server: notebook")
    code, _, err = _plan(capsys, SAMPLE / "claims.yaml", _write(tmp_path, shared))
    assert code == 0
    assert "(Deployment infer): its 3 pods all name claim(s) notebook, which serve one pod at a time" in err, err


def test_a_wait_for_first_consumer_claim_a_pod_uses_is_bound_for_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """examples/claim-whole-card.yaml (class whole-a100, WaitForFirstConsumer) with a pod that uses it binds,
    as the controller binds it once the pod exists; alone it waits for its first consumer."""
    classes = ROOT / "examples" / "class-physical.yaml"
    nodes = _write(tmp_path, "nodes: [{name: gpu-a, cards: 2, model: A100-SXM4-80GB, memory: 80Gi,"
                             " labels: {pool: gpu}}]\n", "nodes.yaml")
    claim = ROOT / "examples" / "claim-whole-card.yaml"
    uses = POD.replace("team-a", "default").replace("ANNOTATIONS", "{egpuc.elasticgpu.io/train: trainer}")
    pod = _write(tmp_path, uses, "pod.yaml")
    assert cli.main(["plan", "-f", str(nodes), "-f", str(classes), "-f", str(claim)]) == 0
    alone = capsys.readouterr().out
    assert "Pending" in alone and "WaitingForFirstConsumer" in alone
    assert cli.main(["plan", "--strict", "-f", str(nodes), "-f", str(classes), "-f", str(claim), "-f", str(pod)]) == 0
    used = capsys.readouterr().out
    assert "Bound" in used and "bound for its pod (WaitForFirstConsumer)" in used, used
