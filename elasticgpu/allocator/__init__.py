"""The allocator: which node and card(s) a claim gets. Pure code, no I/O, no Kubernetes.

Build an `Inventory` from plain records, wrap it in an `Allocator`, ask, then commit:

    inventory = Inventory()
    inventory.add_node(NodeRecord(name="node-1", cpu_milli=96000, memory_mib=393216, labels={...}))
    inventory.add_card(CardRecord(uuid="GPU-1", node="node-1", index=0, model="A100-SXM4-80GB",
                                  memory_mib=81920, numa=0, links=frozenset({"GPU-2"})))
    allocator = Allocator(inventory, policy="fragmentation", seed=0)

    result = allocator.place(PlacementRequest(gpu=GpuRequest.share(30, 10240), models=("A100*",)))
    if isinstance(result, Placement):          # node, card shares (uuid, cores, MiB, whole)
        allocator.reserve("ns/claim-uid", result)   # idempotent for the same key + placement
    else:                                      # Unplaceable: result.reason is for the user
        ...
    allocator.release("ns/claim-uid")          # unknown keys are a no-op

- `place(request)` never mutates. `reserve(key, placement)` raises `ReservationConflict` (and
  changes nothing) if the placement no longer fits or the key holds another placement; after a
  lost race, call `place` again.
- Restoring after a restart: `reserve` each allocation read from the GPUs' status under its
  claim key; health is not checked there, so reservations on an Unhealthy card are kept.
- `Inventory.set_health(uuid, Health.UNHEALTHY)`, `remove_card(uuid)` and `remove_node(name)`
  keep the allocator's caches in step; the removals return the claim keys that lost capacity.
- Policies: `fragmentation` (default, fragmentation gradient descent against a `Workload`),
  `binpack`, `spread`; `bestfit`, `packing`, `random` are the benchmark's baselines.
- `Allocator.allocate(key, request)` is `place` + `reserve` in one call.
"""

from elasticgpu.allocator.allocating import Allocator
from elasticgpu.allocator.errors import AllocatorError, DuplicateObject, ReservationConflict, UnknownObject
from elasticgpu.allocator.inventory import CardState, Inventory, NodeState
from elasticgpu.allocator.policies import DEFAULT_POLICY, POLICIES, Policy, make_policy
from elasticgpu.allocator.records import (
    CardRecord,
    CardShare,
    Health,
    NodeRecord,
    Placement,
    PlacementRequest,
    Unplaceable,
)
from elasticgpu.allocator.workloads import Workload

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Allocator",
    "AllocatorError",
    "CardRecord",
    "CardShare",
    "CardState",
    "DuplicateObject",
    "Health",
    "Inventory",
    "NodeRecord",
    "NodeState",
    "Placement",
    "PlacementRequest",
    "Policy",
    "ReservationConflict",
    "UnknownObject",
    "Unplaceable",
    "Workload",
    "make_policy",
]
