"""The placement of a WaitForFirstConsumer pod's MIG claims (`pods/pod_placement`, issue 26), pure:
whatever instances the cards already hold and however many MIG claims the pod has, the proposal
puts them all on one node, each profile at a start it allows, never two instances on one memory
slice of a card (the pod's own claims included: each is planned beside the earlier ones), never
more compute slices than the card has; and proposing changes nothing in the picture."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import PlacementRequest
from elasticgpu.allocator.mig import slots as slot_rules
from elasticgpu.allocator.mig.profiles import by_name
from elasticgpu.api import GpuRequest
from elasticgpu.controller.picture.reservations import Ledger
from elasticgpu.controller.pods import pod_placement
from tests.binding import objects as o

MODEL = by_name("A100-80GB")
CARD_MODEL = "NVIDIA A100-SXM4-80GB"
CORES = st.sampled_from([5, 10, 14, 20, 28, 30, 42, 50, 57, 60, 100])


@st.composite
def cluster(draw: st.DrawFn) -> tuple[Ledger, list[str]]:
    """1-3 nodes of 1-2 MIG cards, each holding instances carved at random (valid ones)."""
    ledger = Ledger()
    nodes = [f"n{i}" for i in range(draw(st.integers(1, 3)))]
    for node in nodes:
        for index in range(draw(st.integers(1, 2))):
            used, allocations = slot_rules.EMPTY, []
            for number in range(draw(st.integers(0, 4))):
                profile = draw(st.sampled_from(MODEL.profiles))
                start = draw(st.sampled_from(profile.starts))
                if slot_rules.fits(MODEL, used, profile, start):
                    used = slot_rules.taking(used, profile, start)
                    allocations.append({"elasticGPU": f"egpu-{node}-{index}-{number}", "cores": profile.cores,
                                        "memory": profile.memory_on(81920),
                                        "partition": {"profile": profile.name, "start": start}})
            body = o.gpu(f"gpu-{node}-{index}", node=node, index=index, model=CARD_MODEL, allocations=allocations)
            body["spec"]["mig"] = True
            body["metadata"]["resourceVersion"] = "1"
            ledger.observe_gpu(body)
    return ledger, nodes


@settings(max_examples=150, deadline=None)
@given(cluster(), st.lists(CORES, min_size=1, max_size=4))
def test_a_pods_mig_claims_never_share_a_slice(world: tuple[Ledger, list[str]], cores: list[int]) -> None:
    ledger, nodes = world
    wanted = [pod_placement.Wanted(claim=f"c{i}", key=f"egpu-pod-{i}", mig=True, policy="fragmentation",
                                   request=PlacementRequest(gpu=GpuRequest(cores=c)))
              for i, c in enumerate(cores)]
    before = {name: ledger.gpu_body(name) for name in ledger.gpu_names()}
    reserved = dict(ledger.inventory.reservations)
    proposal, ruled_out = pod_placement.propose(ledger, wanted, nodes)
    assert {name: ledger.gpu_body(name) for name in ledger.gpu_names()} == before
    assert dict(ledger.inventory.reservations) == reserved  # nothing tentative left behind
    if isinstance(proposal, pod_placement.NoNode):
        return
    assert set(proposal.placements) == {w.key for w in wanted}
    assert proposal.node not in ruled_out
    cards: dict[str, slot_rules.Slots] = {}
    for name in ledger.gpu_names():
        gpu = ledger.gpu(name)
        assert gpu is not None
        used = slot_rules.EMPTY
        for allocation in gpu.status.allocations:
            assert allocation.partition is not None
            used = slot_rules.taking(used, MODEL.profile(allocation.partition.profile), allocation.partition.start)
        cards[gpu.spec.uuid] = used
    for key, placement in proposal.placements.items():
        assert placement.node == proposal.node
        for share in placement.cards:
            partition = proposal.partitions[key][share.uuid]
            profile = MODEL.profile(partition.profile)
            assert slot_rules.why_not(MODEL, cards[share.uuid], profile, partition.start) == ""
            cards[share.uuid] = slot_rules.taking(cards[share.uuid], profile, partition.start)
