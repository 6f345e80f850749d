"""Claim groups (gangs, issue 27 item 4): all-or-none binding against claim-by-claim binding.

A pure allocator simulation (no API server): 64 nodes of 8 cards, 12 simulated hours, 3 seeds.
The workload is derived from the openb trace (../shared/traces/openb/README.md, the default pod
list): its multi-GPU pods (2, 4 or 8 cards) become the workers of gang jobs, grouped 2, 4 or 8
workers to a job (all workers of a job have one shape, as a data-parallel job's do), and its
one-card and shared-card pods are single-claim jobs beside them. Each job's run time is its
pod's lifetime in the trace (deletion - scheduled), clipped to [10 min, 3 h]. Jobs arrive as a
Poisson stream whose offered load is `--load` x the cluster's cards (gang jobs about half of
it). A job runs once every one of its claims is bound, and frees them when it ends.

Three binders, the same arrivals:

- claim-by-claim (today, without groups): every claim is bound on its own as soon as it fits,
  in arrival order; a job's workers that bound hold their cards idle until the last one binds;
- all-or-none: a job's claims are placed together (biggest first, as `allocator.groups.
  place_group` does) and reserved only if all fit; a job that does not fit holds nothing, and
  the claims behind it are still tried (no head-of-line blocking);
- all-or-none + bounded wait: as above, and a gang waiting past `--reserve-after` minutes gets
  the nodes its plan needs on an empty cluster (`room_for_group`) kept from other claims until
  it binds, one waiter at a time (the controller's `group_reserve_after_s`).

Figures per binder, averaged over the seeds: cards held idle by partial groups (reserved for a
job that is not running; the time average and the peak), jobs completed per simulated hour (all
jobs, and gang jobs), card utilisation (cards of running jobs), and the wait of gang jobs
(arrival -> running: median, p95, the longest, and how many still wait at the end).

    python bench/gangs.py                  # 64 nodes, 12 h, seeds 1-3
    python bench/gangs.py --hours 2 --seeds 1
"""

from __future__ import annotations

import argparse
import csv
import heapq
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.allocator import (  # noqa: E402
    Allocator,
    CardRecord,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
)
from elasticgpu.allocator.groups import GroupMember, room_for_group  # noqa: E402
from elasticgpu.api.resources import GpuRequest  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "openb" / "openb_pod_list_default.csv"
if not TRACE.exists():
    TRACE = Path("/work/shared/traces/openb/openb_pod_list_default.csv")
CARDS_PER_NODE = 8
CARD_MEMORY_MIB = 81920
MIN_RUN_S, MAX_RUN_S = 600.0, 3 * 3600.0
GANG_SIZES = (2, 4, 8)
GANG_SHARE_OF_LOAD = 0.5
BINDERS = ("claim-by-claim", "all-or-none", "all-or-none + bounded wait")


@dataclass(frozen=True)
class Shape:
    """One trace pod: its GPU request and its run time."""

    gpu: GpuRequest
    cards_equivalent: float
    run_s: float


@dataclass
class Job:
    """One arrival: `workers` claims of one shape (1 for a single-claim job)."""

    index: int
    arrival: float
    shape: Shape
    workers: int
    bound: list[str] = field(default_factory=list)
    started: float | None = None

    @property
    def gang(self) -> bool:
        return self.workers > 1

    def key(self, worker: int) -> str:
        return f"j{self.index}-w{worker}"


def load_shapes(path: Path) -> tuple[list[Shape], list[Shape]]:
    """The trace's multi-GPU pods (gang workers) and its one-card and shared pods (singles)."""
    multi: list[Shape] = []
    single: list[Shape] = []
    with path.open() as f:
        for row in csv.DictReader(f):
            num_gpu, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num_gpu == 0 or not row["deletion_time"] or not row["scheduled_time"]:
                continue
            run_s = min(MAX_RUN_S, max(MIN_RUN_S, float(row["deletion_time"]) - float(row["scheduled_time"])))
            if num_gpu >= 2:
                multi.append(Shape(GpuRequest.whole(num_gpu), float(num_gpu), run_s))
            elif milli < 1000:
                single.append(Shape(GpuRequest.share(milli // 10), milli / 1000, run_s))
            else:
                single.append(Shape(GpuRequest.whole(1), 1.0, run_s))
    return multi, single


def arrivals(multi: list[Shape], single: list[Shape], *, cards: int, hours: float, load: float,
             seed: int) -> list[Job]:
    """A Poisson stream of jobs offering `load` x `cards` of card-time, half of it gangs."""
    rng = random.Random(seed)
    gang_work = statistics.mean(s.cards_equivalent * s.run_s for s in multi) * statistics.mean(GANG_SIZES)
    single_work = statistics.mean(s.cards_equivalent * s.run_s for s in single)
    gang_rate = GANG_SHARE_OF_LOAD * load * cards / gang_work  # jobs per second
    single_rate = (1 - GANG_SHARE_OF_LOAD) * load * cards / single_work
    jobs: list[Job] = []
    for rate, pool, gang in ((gang_rate, multi, True), (single_rate, single, False)):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= hours * 3600:
                break
            jobs.append(Job(0, t, rng.choice(pool), rng.choice(GANG_SIZES) if gang else 1))
    jobs.sort(key=lambda j: j.arrival)
    for i, job in enumerate(jobs):
        job.index = i
    return jobs


def cluster(nodes: int) -> Inventory:
    inventory = Inventory()
    for n in range(nodes):
        name = f"node-{n:03d}"
        inventory.add_node(NodeRecord(name=name))
        for i in range(CARDS_PER_NODE):
            inventory.add_card(CardRecord(uuid=f"{name}-gpu{i}", node=name, index=i, model="G2",
                                          memory_mib=CARD_MEMORY_MIB, numa=i // 4))
    return inventory


@dataclass
class Result:
    binder: str
    seed: int
    idle_avg: float = 0.0
    idle_peak: float = 0.0
    jobs_per_h: float = 0.0
    gangs_per_h: float = 0.0
    utilisation: float = 0.0
    gang_waits: list[float] = field(default_factory=list)
    still_waiting: int = 0
    longest_waiting_s: float = 0.0
    seconds: float = 0.0


class Simulation:
    """One binder over one arrival stream."""

    def __init__(self, binder: str, jobs: list[Job], *, nodes: int, hours: float, reserve_after_s: float,
                 seed: int) -> None:
        self.binder = binder
        self.jobs = jobs
        self.horizon = hours * 3600
        self.reserve_after_s = reserve_after_s
        self.inventory = cluster(nodes)
        self.allocator = Allocator(self.inventory, policy="binpack")
        self.cards = nodes * CARDS_PER_NODE
        self.pending: list[Job] = []
        self.finishing: list[tuple[float, int]] = []
        self.kept: tuple[Job, frozenset[str]] | None = None
        self.result = Result(binder, seed)
        self._idle = 0.0  # cards reserved for jobs not running
        self._busy = 0.0  # cards of running jobs
        self._last = 0.0
        self._idle_area = 0.0
        self._busy_area = 0.0

    # -- time-weighted figures -----------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        self._idle_area += self._idle * (now - self._last)
        self._busy_area += self._busy * (now - self._last)
        self._last = now

    # -- placing -------------------------------------------------------------------------------------

    def _request(self, job: Job) -> PlacementRequest:
        nodes: frozenset[str] = frozenset()
        if self.kept is not None and self.kept[0] is not job:
            nodes = frozenset(self.inventory.node_names()) - self.kept[1]
        return PlacementRequest(gpu=job.shape.gpu, nodes=nodes)

    def _try(self, job: Job, worker: int) -> bool:
        placed = self.allocator.place(self._request(job), explain=False)
        if not isinstance(placed, Placement):
            return False
        self.inventory.reserve(job.key(worker), placed)
        job.bound.append(job.key(worker))
        self._idle += job.shape.cards_equivalent
        return True

    def _try_all(self, job: Job) -> bool:
        """All of the job's claims or none (place_group's way: on the inventory, undone on a miss)."""
        for worker in range(job.workers):
            if not self._try(job, worker):
                for key in job.bound:
                    self.inventory.release(key)
                self._idle -= job.shape.cards_equivalent * len(job.bound)
                job.bound.clear()
                return False
        return True

    def _start_if_complete(self, job: Job, now: float) -> None:
        if len(job.bound) == job.workers and job.started is None:
            job.started = now
            cards = job.shape.cards_equivalent * job.workers
            self._idle -= cards
            self._busy += cards
            heapq.heappush(self.finishing, (now + job.shape.run_s, job.index))
            if job.gang:
                self.result.gang_waits.append(now - job.arrival)
            if self.kept is not None and self.kept[0] is job:
                self.kept = None

    def _schedule(self, now: float) -> None:
        """One pass over the waiting jobs in arrival order (none blocks the ones behind it).
        A shape that found no room is not tried again in the same pass: room only shrinks."""
        failed: set[tuple[object, ...]] = set()
        if self.binder.endswith("bounded wait") and self.kept is None:
            starved = next((j for j in self.pending if j.gang and now - j.arrival >= self.reserve_after_s), None)
            if starved is not None:
                members = [GroupMember(starved.key(w), PlacementRequest(gpu=starved.shape.gpu))
                           for w in range(starved.workers)]
                room = room_for_group(self.inventory, members)
                if room is not None:
                    self.kept = (starved, frozenset(self.inventory.card(u).record.node for u in room))
        still: list[Job] = []
        for job in self.pending:
            shape = (job.shape.gpu, job.workers - len(job.bound), self.kept is not None and self.kept[0] is job)
            if shape in failed:
                still.append(job)
                continue
            if self.binder == "claim-by-claim":
                while len(job.bound) < job.workers and self._try(job, len(job.bound)):
                    pass
                if len(job.bound) < job.workers:
                    failed.add(shape)
            elif not self._try_all(job):
                failed.add(shape)
            self._start_if_complete(job, now)
            if job.started is None:
                still.append(job)
        self.pending = still

    # -- the run -------------------------------------------------------------------------------------

    def run(self) -> Result:
        started = time.perf_counter()
        jobs = iter(self.jobs)
        upcoming = next(jobs, None)
        done = done_gangs = 0
        while True:
            next_finish = self.finishing[0][0] if self.finishing else float("inf")
            next_arrival = upcoming.arrival if upcoming is not None else float("inf")
            now = min(next_finish, next_arrival)
            if now >= self.horizon:
                break
            self._advance(now)
            if next_finish <= next_arrival:
                while self.finishing and self.finishing[0][0] <= now:
                    _, index = heapq.heappop(self.finishing)
                    job = self.jobs[index]
                    for key in job.bound:
                        self.inventory.release(key)
                    self._busy -= job.shape.cards_equivalent * job.workers
                    done += 1
                    done_gangs += job.gang
            else:
                assert upcoming is not None
                self.pending.append(upcoming)
                upcoming = next(jobs, None)
            self._schedule(now)
            self.result.idle_peak = max(self.result.idle_peak, self._idle)
        self._advance(self.horizon)
        r = self.result
        hours = self.horizon / 3600
        r.idle_avg = self._idle_area / self.horizon
        r.utilisation = 100.0 * self._busy_area / self.horizon / self.cards
        r.jobs_per_h = done / hours
        r.gangs_per_h = done_gangs / hours
        waiting = [j for j in self.pending if j.gang]
        r.still_waiting = len(waiting)
        r.longest_waiting_s = max((self.horizon - j.arrival for j in waiting), default=0.0)
        r.seconds = time.perf_counter() - started
        return r


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=12.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--load", type=float, default=1.1, help="offered card-time over the cluster's cards")
    parser.add_argument("--reserve-after", type=float, default=5.0, help="minutes before room is kept for a gang")
    parser.add_argument("--trace", type=Path, default=TRACE)
    args = parser.parse_args(argv)
    multi, single = load_shapes(args.trace)
    print(f"trace {args.trace.name}: {len(multi)} multi-GPU pods (gang workers, {GANG_SIZES} to a job),"
          f" {len(single)} one-card/shared pods; {args.nodes} nodes x {CARDS_PER_NODE} cards, {args.hours:g} h,"
          f" offered load {args.load:g}, seeds 1-{args.seeds}")
    results: dict[str, list[Result]] = {b: [] for b in BINDERS}
    for seed in range(1, args.seeds + 1):
        jobs = arrivals(multi, single, cards=args.nodes * CARDS_PER_NODE, hours=args.hours, load=args.load,
                        seed=seed)
        for binder in BINDERS:
            fresh = [Job(j.index, j.arrival, j.shape, j.workers) for j in jobs]
            sim = Simulation(binder, fresh, nodes=args.nodes, hours=args.hours,
                             reserve_after_s=args.reserve_after * 60, seed=seed)
            results[binder].append(sim.run())
        print(f"  seed {seed}: {len(jobs)} jobs ({sum(j.workers > 1 for j in jobs)} gangs)")
    mean: Callable[[list[float]], float] = statistics.mean
    print(f"\n{'binder':28} {'idle avg':>8} {'idle peak':>9} {'jobs/h':>7} {'gangs/h':>7} {'util %':>6}"
          f" {'gang wait p50/p95/max (min)':>28} {'gangs waiting at end (oldest, min)':>35} {'sim s':>6}")
    for binder, runs in results.items():
        waits = [w / 60 for r in runs for w in r.gang_waits]
        print(f"{binder:28} {mean([r.idle_avg for r in runs]):8.1f} {mean([r.idle_peak for r in runs]):9.1f}"
              f" {mean([r.jobs_per_h for r in runs]):7.1f} {mean([r.gangs_per_h for r in runs]):7.1f}"
              f" {mean([r.utilisation for r in runs]):6.1f}"
              f" {_pct(waits, 0.5):8.1f} /{_pct(waits, 0.95):7.1f} /{max(waits, default=0.0):7.1f}"
              f" {mean([r.still_waiting for r in runs]):23.1f} ({max(r.longest_waiting_s for r in runs) / 60:6.1f})"
              f" {mean([r.seconds for r in runs]):6.1f}")
    print("\nidle: cards reserved for jobs whose claims are not all bound (goal 0), time average and peak,"
          " mean over seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
