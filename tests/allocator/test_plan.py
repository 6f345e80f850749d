"""`elasticgpu plan` on the sample input: bound claims, Pending ones with their reason, YAML out."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from elasticgpu import plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plan"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    plan.add_arguments(parser)
    code = plan.run(parser.parse_args(list(argv)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_prints_a_table_with_reasons_for_pending_claims(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "-f", str(EXAMPLES), "--strict")
    assert code == 1  # two sample claims cannot be placed, on purpose
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert out.splitlines()[0].split()[:3] == ["NAMESPACE", "NAME", "STATUS"]
    assert "Bound" in lines["notebook"] and "Bound" in lines["training"]
    assert lines["training"].count("GPU-node-") == 4
    assert "Pending" in lines["too-much-memory"]
    # The controller's reasons and words (issue 36): 96Gi can never fit an 80Gi card; no H100 is here yet.
    never = "NeverFits: no card in this cluster can ever give 20% cores, 96Gi: the largest is"
    assert never in lines["too-much-memory"]
    # A missing model is NoCapacity, not NeverFits (a node with such cards may join), and the message says so.
    assert lines["wants-h100"].endswith("NoCapacity: no card can give 1 whole card: no node has a *H100* card"
                                        " yet (models here: NVIDIA A100-SXM4-80GB, Tesla T4); it binds once one"
                                        " joins, or fix the class's gpuModel")


CLAIM = """\
apiVersion: elasticgpu.io/v1alpha1
kind: ElasticGPUClaim
metadata: {name: NAME, namespace: team-a}
spec:
  resources:
    requests: REQUESTS
"""


def _claims(tmp_path: Path, *claims: tuple[str, str], extra: str = "") -> Path:
    path = tmp_path / "claims.yaml"
    path.write_text("---\n".join(CLAIM.replace("NAME", n).replace("REQUESTS", r) for n, r in claims) + extra)
    return path


def test_plan_refuses_what_the_controller_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 36: two whole cards under the default class gpushare (slices of one card) were Bound
    by plan and InvalidRequest on the cluster; plan now decides through the controller's binder."""
    claims = _claims(tmp_path, ("two-cards", "{nvidia.com/gpu: 2}"), ("slice", "{elasticgpu.io/gpu-core: 30}"))
    code, out, _ = run(capsys, "-f", str(EXAMPLES / "nodes.yaml"), "-f", str(EXAMPLES / "classes.yaml"),
                       "-f", str(claims), "--strict")
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert code == 1
    assert "Pending" in lines["two-cards"] and "<none>" in lines["two-cards"]
    assert "InvalidRequest: spec.resources: class gpushare provisions slices of one card" in lines["two-cards"]
    assert "Bound" in lines["slice"]


def test_plan_keeps_a_wait_for_first_consumer_claim_pending_and_says_where_it_would_go(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wffc = ("---\napiVersion: elasticgpu.io/v1alpha1\nkind: ElasticGPUClass\nmetadata: {name: later}\n"
            "provisioner: elasticgpu.io/gpushare\nbindingMode: WaitForFirstConsumer\n")
    claims = _claims(tmp_path, ("waits", "{elasticgpu.io/gpu-core: 30}"), extra=wffc)
    claims.write_text(claims.read_text().replace("spec:\n", "spec:\n  elasticGPUClassName: later\n", 1))
    [result] = plan.plan(plan.read_inputs([str(EXAMPLES / "nodes.yaml"), str(claims)]))
    assert (result.phase, result.reason) == ("Pending", "WaitingForFirstConsumer")
    assert result.would_fit is not None and "a pod using it now would get node-" in result.message


def test_plan_yaml_lists_the_elastic_gpus_it_would_create(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "-f", str(EXAMPLES), "-o", "yaml")
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    by_claim = {d["spec"]["claimRef"]["name"]: d for d in docs}
    assert set(by_claim) == {"notebook", "inference", "training"}
    assert by_claim["training"]["spec"]["capacity"] == {"nvidia.com/gpu": 4}
    assert len(by_claim["training"]["spec"]["physicalGPU"]["gpuNames"]) == 4
    assert by_claim["notebook"]["spec"]["capacity"] == {
        "elasticgpu.io/gpu-core": 30,
        "elasticgpu.io/gpu-memory": "10Gi",
    }
    assert "too-much-memory stays Pending" in err


def test_plan_reads_gpu_objects_and_keeps_their_reservations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = [
        {
            "apiVersion": "elasticgpu.io/v1alpha1",
            "kind": "GPU",
            "metadata": {"name": f"gpu-{i}"},
            "spec": {"index": i, "uuid": f"GPU-{i}", "model": "A100", "memory": 40960, "nodeName": "n1"},
            "status": {
                "allocations": [{"elasticGPU": "egpu-old", "cores": 100, "memory": 40960, "exclusive": True}]
                if i == 0
                else []
            },
        }
        for i in range(2)
    ]
    docs.append(
        {
            "apiVersion": "elasticgpu.io/v1alpha1",
            "kind": "ElasticGPUClass",
            "metadata": {"name": "whole", "annotations": {"elasticgpu.io/is-default-class": "true"}},
            "provisioner": "elasticgpu.io/physical",
        }
    )
    for name in ("one", "two"):
        docs.append(
            {
                "apiVersion": "elasticgpu.io/v1alpha1",
                "kind": "ElasticGPUClaim",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"resources": {"requests": {"nvidia.com/gpu": 1}}},
            }
        )
    (tmp_path / "in.yaml").write_text(yaml.safe_dump_all(docs))
    code, out, _ = run(capsys, "-f", str(tmp_path / "in.yaml"), "--strict")
    assert code == 1
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert "GPU-1" in lines["one"]  # GPU-0 is held whole by egpu-old
    assert lines["two"].endswith("NoCapacity: no card can give 1 whole card: n1 has 0 free cards (of 2), the claim asks"
                                 " 1 whole card on one node (closest: n1)")


def test_plan_subcommand_defaults_to_the_sample(capsys: pytest.CaptureFixture[str]) -> None:
    from elasticgpu.cli import main

    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:3] == ["NAMESPACE", "NAME", "STATUS"]
    assert "Pending" in out and "Bound" in out


def test_plan_places_a_class_s_slices_only_where_its_isolation_mode_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    docs = [
        {"nodes": [{"name": "plain", "cards": 1, "model": "A100", "memory": "80Gi"},
                   {"name": "mps", "cards": 1, "model": "A100", "memory": "80Gi", "isolation": ["MPS"]}]},
        {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClass", "metadata": {"name": "c"},
         "provisioner": "elasticgpu.io/gpushare", "isolation": "HAMiCore"},
        {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClass", "metadata": {"name": "m"},
         "provisioner": "elasticgpu.io/gpushare", "isolation": "MPS"},
        *({"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClaim",
           "metadata": {"name": name, "namespace": "ns"},
           "spec": {"elasticGPUClassName": klass, "resources": {"requests": {"elasticgpu.io/gpu-core": 30}}}}
          for name, klass in (("hami", "c"), ("mps-slice", "m"))),
    ]
    (tmp_path / "input.yaml").write_text(yaml.safe_dump_all(docs))
    _code, out, _ = run(capsys, "-f", str(tmp_path / "input.yaml"))
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert "Pending" in lines["hami"] and lines["hami"].count("no card on any node supports isolation HAMiCore")
    assert "Bound" in lines["mps-slice"] and "GPU-mps-0" in lines["mps-slice"]


def test_plan_shows_the_chosen_cards_topology(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 27: four cards, 2 and 3 an NVLink pair under a root with a NIC: a pair with a NIC goes
    there and the message says how the cards are joined; a required NVLink trio stays Pending."""
    docs: list[dict[str, object]] = []
    for i in range(4):
        spec: dict[str, object] = {"index": i, "uuid": f"GPU-{i}", "model": "A100", "memory": 40960,
                                   "nodeName": "n1", "numa": i // 2}
        if i >= 2:
            spec.update(links=[f"GPU-{5 - i}"], pcieRoot="0000:00:03.0", nics=["mlx5_0"])
        docs.append({"apiVersion": "elasticgpu.io/v1alpha1", "kind": "GPU", "metadata": {"name": f"gpu-{i}"},
                     "spec": spec})
    docs.append({"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClass", "topology": "NVLink",
                 "metadata": {"name": "train", "annotations": {"elasticgpu.io/is-default-class": "true"}},
                 "provisioner": "elasticgpu.io/physical"})
    for name, requests in (("pair", {"nvidia.com/gpu": 2, "elasticgpu.io/rdma": 1}), ("trio", {"nvidia.com/gpu": 3})):
        docs.append({"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClaim",
                     "metadata": {"name": name, "namespace": "ns"}, "spec": {"resources": {"requests": requests}}})
    (tmp_path / "in.yaml").write_text(yaml.safe_dump_all(docs))
    _, out, _ = run(capsys, "-f", str(tmp_path / "in.yaml"))
    lines = {line.split()[1]: line for line in out.splitlines()[1:]}
    assert lines["pair"].endswith(
        "GPU-2,GPU-3   NVLink: all linked (1 pair), NUMA 1, PCIe root 0000:00:03.0, NICs mlx5_0")
    assert "2 whole cards and 1 RDMA NIC" in lines["pair"]
    assert "Pending" in lines["trio"] and "topology NVLink" in lines["trio"]


def test_plan_says_cards_without_nvlink_are_joined_by_pcie(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 50: four T4s (no NVLink) showed "NVLink: 0 of 6 pairs linked", which reads like a fault."""
    nodes = [{"name": "t4-node", "cards": 4, "model": "Tesla T4", "memory": "16Gi"}]
    whole = {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClass", "metadata": {"name": "whole"},
             "provisioner": "elasticgpu.io/physical"}
    claim = {"apiVersion": "elasticgpu.io/v1alpha1", "kind": "ElasticGPUClaim",
             "metadata": {"name": "four", "namespace": "ns"},
             "spec": {"elasticGPUClassName": "whole", "resources": {"requests": {"nvidia.com/gpu": 4}}}}
    found = plan.PlanInput(gpus=[], node_list=nodes, classes=[plan.ElasticGPUClass.model_validate(whole)],
                           claims=[plan.ElasticGPUClaim.model_validate(claim)])
    [result] = plan.plan(found)
    assert result.placement is not None and result.message.startswith("no NVLink (PCIe between the cards)"), result
