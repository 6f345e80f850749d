"""Property tests of the bind order (`decisions.bind_order`) driven through the pure allocator.

A stream of steps from ten namespaces: each step some claims arrive (random sizes), some bound
claims are released, then one bind pass tries the waiting claims in bind order, binding what
the allocator can place. Checked at every bind, from the test's own bookkeeping:

- FairShare: the claim bound belongs to a namespace of least weighted use among those with a
  waiting claim that fits now (ties: the oldest claim); and no namespace starves: while it waits
  with a claim that fits, the binds that go to others are bounded (by releases meanwhile plus
  what the others may take before they hold more than it does);
- FIFO: no waiting claim older than the one bound fits now;
- both: after each pass no waiting claim fits (no head-of-line blocking: a claim that does not
  fit never keeps a claim behind it from binding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.allocator import Allocator, CardRecord, Inventory, NodeRecord, Placement, PlacementRequest
from elasticgpu.api.gpu_class import BindOrder
from elasticgpu.api.resources import GpuRequest
from elasticgpu.controller.decisions import bind_order
from elasticgpu.controller.decisions.bind_order import Waiting

NAMESPACES = [f"ns-{i}" for i in range(10)]
CARDS = 4
CAPACITY = CARDS * 100
SIZES = [10, 20, 25, 50]
MAX_WEIGHT = 3

arrivals = st.lists(st.tuples(st.integers(0, 9), st.sampled_from(SIZES)), max_size=8)
# Namespace 0 floods: many claims each step, so FIFO would serve it far more than the others.
flood = st.integers(0, 6)
releases = st.lists(st.integers(0, 1000), max_size=4)
steps = st.lists(st.tuples(arrivals, flood, releases), min_size=1, max_size=25)
weights = st.lists(st.integers(1, MAX_WEIGHT), min_size=10, max_size=10)


def allocator() -> Allocator:
    inventory = Inventory()
    inventory.add_node(NodeRecord(name="node-0", cpu_milli=0, memory_mib=0))
    for i in range(CARDS):
        inventory.add_card(CardRecord(uuid=f"GPU-{i}", node="node-0", index=i, model="A100", memory_mib=81920,
                                      numa=0, links=frozenset()))
    return Allocator(inventory, policy="binpack", seed=0)


def request(cores: int) -> PlacementRequest:
    return PlacementRequest(gpu=GpuRequest.share(cores))


@dataclass
class World:
    """The cluster of one example and the test's own account of it."""

    mode: BindOrder
    weight: dict[str, float]
    alloc: Allocator = field(default_factory=allocator)
    waiting: list[Waiting] = field(default_factory=list)
    bound: list[Waiting] = field(default_factory=list)
    use: dict[str, float] = field(default_factory=dict)
    arrivals: int = 0
    wait_binds: dict[str, int] = field(default_factory=dict)
    """Binds to other namespaces since each namespace last had no fitting claim or got a bind."""
    wait_releases: dict[str, int] = field(default_factory=dict)
    wait_peak: dict[str, float] = field(default_factory=dict)
    """Highest share of each waiting namespace during its wait."""
    worst_excess: int = 0

    def share(self, namespace: str) -> float:
        return self.use.get(namespace, 0.0) / self.weight[namespace]

    def fits(self, claim: Waiting) -> bool:
        return isinstance(self.alloc.place(request(claim.cores), explain=False), Placement)

    def arrive(self, namespace: str, cores: int, step: int) -> None:
        self.arrivals += 1
        # One creationTimestamp per step (one-second resolution): ties are broken by arrival.
        created = f"2026-01-01T00:{step:02d}:00Z"
        self.waiting.append(Waiting(namespace=namespace, name=f"c-{self.arrivals}", created=created,
                                    arrival=self.arrivals, cores=cores, order=self.mode))

    def release(self, index: int) -> None:
        if not self.bound:
            return
        claim = self.bound.pop(index % len(self.bound))
        self.alloc.release(claim.name)
        self.use[claim.namespace] -= claim.cores
        for namespace in self.wait_releases:
            self.wait_releases[namespace] += 1

    def fitting_namespaces(self) -> set[str]:
        return {c.namespace for c in self.waiting if self.fits(c)}

    def try_bind(self, claim: Waiting) -> bool:
        fitting = [c for c in self.waiting if self.fits(c)]
        result = self.alloc.place(request(claim.cores), explain=False)
        if not isinstance(result, Placement):
            return False
        assert claim in fitting
        if self.mode == "FIFO":
            older = [c for c in fitting if c.age() < claim.age()]
            assert not older, f"FIFO bound {claim.name} while older {older[0].name} fits"
        else:
            mine = self.share(claim.namespace)
            for other in fitting:
                assert self.share(other.namespace) >= mine, (
                    f"FairShare bound {claim.name} of {claim.namespace} (share {mine}) while {other.name} of"
                    f" {other.namespace} (share {self.share(other.namespace)}) fits")
                if self.share(other.namespace) == mine:
                    assert other.age() >= claim.age() or other.namespace == claim.namespace
        self.count_wait(claim, {c.namespace for c in fitting})
        self.alloc.reserve(claim.name, result)
        self.waiting.remove(claim)
        self.bound.append(claim)
        self.use[claim.namespace] = self.use.get(claim.namespace, 0.0) + claim.cores
        return True

    def count_wait(self, claim: Waiting, fitting: set[str]) -> None:
        """Starvation account: binds that go to others while a namespace waits with a claim that fits."""
        for namespace in list(self.wait_binds):
            if namespace not in fitting:
                del self.wait_binds[namespace], self.wait_releases[namespace], self.wait_peak[namespace]
        for namespace in fitting - {claim.namespace}:
            self.wait_binds[namespace] = self.wait_binds.get(namespace, 0) + 1
            self.wait_releases.setdefault(namespace, 0)
            peak = self.wait_peak[namespace] = max(self.wait_peak.get(namespace, 0.0), self.share(namespace))
            # While it waits its use cannot grow; another namespace is served before it only while it
            # holds no more (weighted): at most peak * weight / smallest size binds each (+1 for the
            # tie), plus per release meanwhile what the released cores give back (largest / smallest).
            per_release = max(SIZES) // min(SIZES)
            bound = self.wait_releases[namespace] * per_release + 9 * (int(peak * MAX_WEIGHT) // min(SIZES) + 1)
            self.worst_excess = max(self.worst_excess, self.wait_binds[namespace] - bound)
        self.wait_binds.pop(claim.namespace, None)
        self.wait_releases.pop(claim.namespace, None)
        self.wait_peak.pop(claim.namespace, None)

    def bind_pass(self) -> None:
        use = {"": dict(self.use)}
        bind_order.bind_pass(list(self.waiting), try_bind=self.try_bind, use=use, weights=self.weight)
        stuck = [c.name for c in self.waiting if self.fits(c)]
        assert not stuck, f"{self.mode}: {stuck} fit after the pass (a claim blocked the ones behind it)"


def run(mode: BindOrder, stream: list[tuple[list[tuple[int, int]], int, list[int]]], weight: list[int]) -> World:
    world = World(mode=mode, weight={ns: float(w) for ns, w in zip(NAMESPACES, weight, strict=True)})
    for step, (arrived, flooded, released) in enumerate(stream):
        for index, cores in [(0, 10)] * flooded + arrived:
            world.arrive(NAMESPACES[index], cores, step)
        for index in released:
            world.release(index)
        world.bind_pass()
    return world


@settings(max_examples=150)
@given(stream=steps, weight=weights)
def test_fair_share_serves_the_least_served_fitting_namespace_and_none_starves(
        stream: list[tuple[list[tuple[int, int]], int, list[int]]], weight: list[int]) -> None:
    world = run("FairShare", stream, weight)
    assert world.worst_excess <= 0, f"a namespace waited {world.worst_excess} binds past the bound"


@settings(max_examples=150)
@given(stream=steps)
def test_fifo_binds_the_oldest_fitting_claim_first(stream: list[tuple[list[tuple[int, int]], int, list[int]]]) -> None:
    run("FIFO", stream, [1] * 10)


def test_fifo_lets_a_flood_go_first_fair_share_does_not() -> None:
    """The starvation account can fail: under FIFO, namespace 0's older backlog takes 30 freed
    slots while namespace 1, holding nothing, waits with a claim that fits."""
    stream: list[tuple[list[tuple[int, int]], int, list[int]]] = [
        ([], 40, []),  # ns-0 fills the four cards (40 x 10 cores)
        ([], 30, []),  # and queues 30 more
        ([(1, 10)], 0, []),  # ns-1 asks for 10 cores
        ([], 0, [0] * 40),  # everything is released at once
    ]
    fifo = run("FIFO", stream, [1] * 10)
    fair = run("FairShare", stream, [1] * 10)
    assert fifo.worst_excess > 0
    assert fair.worst_excess <= 0
    assert [c.namespace for c in fair.bound[:2]] == ["ns-0", "ns-1"]


def test_a_claim_that_does_not_fit_does_not_block_the_ones_behind_it() -> None:
    for mode in ("FIFO", "FairShare"):
        world = World(mode=mode, weight=dict.fromkeys(NAMESPACES, 1.0))
        for _ in range(7):
            world.arrive("ns-0", 50, 0)  # 3.5 cards: the 8th half card stays free
        world.bind_pass()
        world.arrive("ns-1", 100, 1)  # oldest waiting, does not fit
        world.arrive("ns-2", 50, 2)
        world.bind_pass()
        assert [c.namespace for c in world.waiting] == ["ns-1"]
        assert world.use["ns-2"] == 50


def test_fair_share_weights_divide_use() -> None:
    """ns-a holds 200 cores with weight 4 (share 50), ns-b 100 with weight 1 (share 100): ns-a first."""
    claims = [Waiting(namespace=ns, name=f"{ns}-x", created="2026-01-01T00:00:00Z", arrival=i, cores=10,
                      order="FairShare") for i, ns in enumerate(["ns-b", "ns-a"])]
    use = {"": {"ns-a": 200.0, "ns-b": 100.0}}
    assert [w.namespace for w in bind_order.order(claims, use=use, weights={"ns-a": 4.0})] == ["ns-a", "ns-b"]
    assert [w.namespace for w in bind_order.order(claims, use=use)] == ["ns-b", "ns-a"]


def test_fifo_is_by_creation_time_not_arrival() -> None:
    """After a restart the picture sees claims in list order (by name): age must come from
    creationTimestamp, the arrival order only breaks ties within one second."""
    new = Waiting(namespace="a", name="a-new", created="2026-01-01T00:00:05Z", arrival=0, cores=10)
    old = Waiting(namespace="z", name="z-old", created="2026-01-01T00:00:01Z", arrival=1, cores=10)
    same = Waiting(namespace="b", name="b-same", created="2026-01-01T00:00:01Z", arrival=2, cores=10)
    assert [w.name for w in bind_order.order([new, old, same])] == ["z-old", "b-same", "a-new"]


def test_parse_weight() -> None:
    assert bind_order.parse_weight(None, namespace="team-a") == 1.0
    assert bind_order.parse_weight("2.5", namespace="team-a") == 2.5
    for bad in ("0", "-1", "nan", "inf", "two"):
        try:
            bind_order.parse_weight(bad, namespace="team-a")
        except bind_order.InvalidWeight as err:
            assert "team-a" in str(err) and bind_order.ANNOTATION_FAIR_SHARE_WEIGHT in str(err)
        else:
            raise AssertionError(f"weight {bad!r} was accepted")


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_weight_is_bounded_where_it_is_read(value: float) -> None:
    """Issue 44: the weight took any float, so `1e308` ordered one namespace before every other for good. Only
    0.01..100 is taken (deploy/policies/fair-share-weight.yaml refuses the rest at admission)."""
    try:
        weight = bind_order.parse_weight(repr(value), namespace="team-a")
    except bind_order.InvalidWeight as err:
        assert not bind_order.MIN_WEIGHT <= value <= bind_order.MAX_WEIGHT
        assert "0.01 to 100" in str(err)
    else:
        assert bind_order.MIN_WEIGHT <= weight <= bind_order.MAX_WEIGHT
