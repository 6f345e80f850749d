"""The resize decision (`allocator.resize`), pure: properties over random cards, reservations,
requests, measured use and what the node reports applied."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import resize
from elasticgpu.api import GPU, ElasticGPUClaim, names

CARD_MIB = 81920
EGPU = "egpu-mine"


def _gpu(mine: dict[str, Any], others: list[tuple[int, int]], running: dict[str, Any] | None) -> GPU:
    allocations = [mine] + [{"elasticGPU": f"egpu-other-{i}", "cores": c, "memory": m}
                            for i, (c, m) in enumerate(others)]
    return GPU.model_validate({
        "metadata": {"name": "gpu-a"},
        "spec": {"index": 0, "uuid": "GPU-A", "model": "A100", "memory": CARD_MIB, "nodeName": "n1"},
        "status": {"allocations": allocations, "runningClaims": [running] if running else []},
    })


def _claim(cores: int, memory: int, usage: tuple[int, int] | None) -> ElasticGPUClaim:
    status: dict[str, Any] = {"phase": "Bound", "resizable": True}
    if usage is not None:
        status["usage"] = {"coresUsed": usage[0], "memoryUsed": usage[1]}
    return ElasticGPUClaim.model_validate({
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
        "spec": {"resources": {"requests": {names.RESOURCE_CORE: cores, names.RESOURCE_MEMORY: memory}},
                 "elasticGPUName": EGPU},
        "status": status,
    })


@st.composite
def situations(draw: st.DrawFn) -> tuple[ElasticGPUClaim, GPU]:
    held = (draw(st.integers(1, 99)), draw(st.integers(1, CARD_MIB // 2)))
    others: list[tuple[int, int]] = []
    room = (100 - held[0], CARD_MIB - held[1])
    for _ in range(draw(st.integers(0, 4))):
        if room[0] < 1 or room[1] < 1:
            break
        other = (draw(st.integers(1, room[0])), draw(st.integers(1, room[1])))
        others.append(other)
        room = (room[0] - other[0], room[1] - other[1])
    mine: dict[str, Any] = {"elasticGPU": EGPU, "cores": held[0], "memory": held[1]}
    wanted = (draw(st.integers(1, 99)), draw(st.integers(1, CARD_MIB)))
    if draw(st.booleans()):
        mine["limit"] = {"cores": min(wanted[0], held[0]), "memory": min(wanted[1], held[1])}
    running = None
    if draw(st.booleans()):
        running = {"namespace": "ns", "name": "c", "uid": "u1"}
        if draw(st.booleans()):
            running["applied"] = {"cores": draw(st.integers(0, 100)), "memory": draw(st.integers(0, CARD_MIB))}
    usage = draw(st.none() | st.tuples(st.integers(0, 100), st.integers(0, CARD_MIB)))
    return _claim(wanted[0], wanted[1], usage), _gpu(mine, others, running)


@settings(max_examples=400)
@given(situations())
def test_a_resize_never_oversubscribes_the_card_nor_frees_what_the_node_still_uses(
        situation: tuple[ElasticGPUClaim, GPU]) -> None:
    claim, gpu = situation
    mine = next(a for a in gpu.status.allocations if a.elastic_gpu == EGPU)
    decision = resize.decide_resize(claim, gpus=[gpu], allocations=[mine])
    others = [a for a in gpu.status.allocations if a.elastic_gpu != EGPU]
    if isinstance(decision, resize.Reserve):
        assert sum(a.cores for a in others) + decision.size.cores <= names.CORES_PER_CARD
        assert sum(a.memory for a in others) + decision.size.memory <= gpu.spec.memory
        if not decision.size.fits_in(resize.Size(mine.cores, mine.memory)) or decision.size == resize.size_of(mine):
            return  # an expand (or the limit dropped): nothing is freed
        # A shrink frees capacity only after the limit was set and the node applied it (or runs nothing here).
        assert resize.limit_of(mine) == decision.size
        runs, applied = resize.applied_on(gpu, claim)
        assert not runs or (applied is not None and applied.fits_in(decision.size))
    elif isinstance(decision, resize.SetLimit):
        usage = claim.status.usage
        assert usage is None or resize.Size(usage.cores_used, usage.memory_used).fits_in(decision.limit)
        assert decision.limit.fits_in(resize.size_of(mine))
    elif isinstance(decision, resize.Refuse):
        assert decision.reason in (resize.REASON_NO_ROOM, resize.REASON_SHRINK_BLOCKED), decision
        # A refused request never leaves the node enforcing the limit of an older one.
        assert mine.limit is None, (decision, mine.limit)


def test_no_room_says_how_much_the_card_lacks() -> None:
    gpu = _gpu({"elasticGPU": EGPU, "cores": 30, "memory": 10240}, [(60, 61440)], None)
    decision = resize.decide_resize(_claim(50, 20480, None), gpus=[gpu], allocations=gpu.status.allocations[:1])
    assert isinstance(decision, resize.Refuse) and decision.reason == resize.REASON_NO_ROOM
    assert "lacks 10% cores and 0 MiB" in decision.message
