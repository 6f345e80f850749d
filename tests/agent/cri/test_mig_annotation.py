"""The container annotation naming a MIG instance (`cri/mig_annotation.py`): what the MIG hooks
write is what a ledger rebuild reads back; anything else reads as no instance."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.agent.injecting.mig_annotation import MigAnnotation, parse

NAMES = st.text(alphabet="abcdefABCDEF0123456789-.", min_size=1, max_size=40)
ANNOTATIONS = st.builds(
    MigAnnotation, uuid=NAMES.map(lambda s: f"MIG-{s}"), profile=st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"]),
    start=st.integers(0, 7), card=NAMES.map(lambda s: f"GPU-{s}"), gpu_instance_id=st.integers(0, 14),
    elastic_gpu=NAMES.map(lambda s: f"egpu-{s}"), cores=st.integers(0, 100), memory_mib=st.integers(0, 200_000))


@given(ANNOTATIONS)
def test_what_is_written_reads_back(named: MigAnnotation) -> None:
    assert parse(named.value()) == named


@given(ANNOTATIONS, st.sampled_from(["uuid", "profile", "start", "card", "gpuInstance", "elasticGPU", "cores",
                                     "memory"]))
def test_a_missing_field_reads_as_no_instance(named: MigAnnotation, field: str) -> None:
    kept = ";".join(part for part in named.value().split(";") if not part.startswith(f"{field}="))
    assert parse(kept) is None


def test_garbage_reads_as_no_instance() -> None:
    assert parse("") is None
    assert parse("MIG-1234") is None
    good = MigAnnotation(uuid="MIG-1", profile="3g.40gb", start=4, card="GPU-1", gpu_instance_id=2,
                         elastic_gpu="egpu-1", cores=42, memory_mib=40960).value()
    assert parse(good.replace("start=4", "start=four")) is None
