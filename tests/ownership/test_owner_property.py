"""One owner per card as a property (issue 48.1): any interleaving of the platform team's moves, our
reservations (placed only where `open_to_elastic_gpu`), a DRA scheduler's allocations (only from a read of
the card at most `LAG_S` old in which our driver publishes it: `open_to_dra`), releases on both sides, time
passing and the controller's owner syncs (`owner_move.decide`) never leaves a card held by both sides, and
never makes the controller write what the CRD refuses (status.owner DRA beside a reservation)."""

from __future__ import annotations

import copy
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from elasticgpu.api import GPU, names
from elasticgpu.api.gpu import open_to_dra, open_to_elastic_gpu
from elasticgpu.controller.decisions import owner_move
from tests.binding import objects as o

GRACE_S = 10.0
LAG_S = 5.0
"""Below the grace less the second the condition's timestamp may lose (RFC 3339, whole seconds)."""
START = 1_800_000_000.0

ACTIONS = ("move", "reserve", "release", "allocate", "deallocate", "tick", "sync")
# One round: every actor gets a turn, in an order of its own; each turn's argument drawn with it.
round_ = st.tuples(
    st.permutations(ACTIONS),
    st.sampled_from((*names.OWNERS, None, None)),  # the platform team moves the card, or not
    st.integers(0, 3),  # which of ours is released / whether ours reserves (0: not)
    st.integers(0, int(LAG_S)),  # how old the scheduler's view of the card is, in seconds
    st.integers(0, 3),  # which DRA claim lets go (0: none)
    st.integers(0, 12),  # seconds passing
)


def _stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(seconds)))


@settings(max_examples=300, deadline=None)
@given(st.lists(round_, max_size=30))
def test_no_interleaving_gives_a_card_to_both_sides(rounds: list[tuple[Any, ...]]) -> None:
    body: dict[str, Any] = o.gpu("gpu-a", allocations=[])
    now = START
    claims: set[int] = set()
    made = 0
    history: list[tuple[float, GPU]] = []
    """The card as each write left it, with when: what a scheduler's lagging cache may still hold."""
    for order, owner, ours, age, theirs, seconds in rounds:
        for what in order:
            gpu = GPU.model_validate(body)
            if not history or history[-1][1] != gpu:
                history.append((now, gpu))
            allocations = body["status"]["allocations"]
            if what == "move" and owner is not None:
                body["spec"]["owner"] = owner
            elif what == "reserve" and ours and open_to_elastic_gpu(gpu) and len(allocations) < 2:
                allocations.append({"elasticGPU": f"egpu-{len(history)}-{ours}", "cores": 10, "memory": 1})
            elif what == "release" and allocations and ours == 3:
                allocations.pop()
            elif what == "allocate":
                seen = [g for t, g in history if t <= now - age]
                if seen and open_to_dra(seen[-1]):
                    made += 1
                    claims.add(made)
            elif what == "deallocate" and claims and theirs == 3:
                claims.discard(min(claims))
            elif what == "tick":
                now += seconds
            elif what == "sync":
                dra = owner_move.DraHolders(known=True, claims=[f"ml/c{c}" for c in sorted(claims)])
                decided = owner_move.decide(gpu, body, dra=dra, now=now, now_rfc3339=_stamp(now), grace_s=GRACE_S)
                if decided.body is not None:
                    status = decided.body["status"]
                    assert not (status.get("owner") == names.OWNER_DRA and status.get("allocations")), \
                        "the controller wrote what the CRD refuses"
                    body = copy.deepcopy(decided.body)
            assert not (body["status"]["allocations"] and claims), f"held by both sides after {what}: {body}"
