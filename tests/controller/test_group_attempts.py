"""The pure decisions on claim group commit attempts (decisions/group_attempts.py): what a
controller may do with an attempt it finds on the GPUs. The safety rules, as properties: a
Complete attempt is never freed, a Committing one is never freed without first being aborted,
and a live (young, not ours) one is never touched."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.api import GPUAllocation
from elasticgpu.controller.decisions.group_attempts import Attempt, Entry, attempts_of, judge

GRACE = 30.0


def _entry(member: str, token: str, state: str = "Committing", gpu: str = "gpu-0", anchor: str = "w0") -> Entry:
    group = {"token": token, "anchor": anchor, "anchorGPU": "gpu-0", "state": state} if token else None
    allocation = GPUAllocation.model_validate({"elasticGPU": f"egpu-{member}", "cores": 100, "memory": 1,
                                               "exclusive": True, "group": group})
    return Entry(gpu, f"egpu-{member}", member, allocation)


def test_attempts_are_grouped_by_token_and_read_their_anchor() -> None:
    entries = [_entry("w0", "a", gpu="gpu-0"), _entry("w1", "a", gpu="gpu-1"), _entry("w0", "b", gpu="gpu-2"),
               _entry("w2", "")]
    anchor = _entry("w0", "a", "Complete").allocation
    found = attempts_of(entries, {"a": (anchor, "gpu-0", "egpu-w0", 5.0)}, {})
    assert [(a.token, a.state, len(a.entries)) for a in found] == [("", "Gone", 1), ("a", "Complete", 2),
                                                                   ("b", "Gone", 1)]
    assert found[1].age_s == 5.0 and found[1].anchor_key == "egpu-w0"


def test_each_state_gets_its_action() -> None:
    one = (_entry("w0", "t"),)
    assert judge(Attempt("t", "Complete", 1e9, one), grace_s=GRACE).action == "keep"
    assert judge(Attempt("t", "Aborted", 0.0, one), grace_s=GRACE).release == one
    waiting = judge(Attempt("t", "Committing", 10.0, one), grace_s=GRACE)
    assert (waiting.action, waiting.wait_s) == ("wait", 20.0)
    assert judge(Attempt("t", "Committing", 31.0, one), grace_s=GRACE).action == "abort"
    assert judge(Attempt("t", "Committing", 0.0, one), grace_s=GRACE, ours={"t"}).action == "abort"
    # Gone: what an ElasticGPU was made for is kept; the rest freed past the grace.
    two = (_entry("w0", ""), _entry("w1", ""))
    assert judge(Attempt("", "Gone", 1e9, two), grace_s=GRACE, provisioned={"egpu-w0", "egpu-w1"}).action == "keep"
    assert judge(Attempt("", "Gone", 1.0, two), grace_s=GRACE, provisioned={"egpu-w0"}).action == "wait"
    freed = judge(Attempt("", "Gone", 1e9, two), grace_s=GRACE, provisioned={"egpu-w0"})
    assert (freed.action, [e.member for e in freed.release]) == ("release", ["w1"])


@given(state=st.sampled_from(["Committing", "Complete", "Aborted", "Gone"]),
       age=st.floats(min_value=0, max_value=1e6), ours=st.booleans(),
       members=st.lists(st.sampled_from(["w0", "w1", "w2", "w3"]), min_size=1, max_size=4, unique=True),
       provisioned=st.sets(st.sampled_from(["egpu-w0", "egpu-w1", "egpu-w2", "egpu-w3"])))
def test_nothing_decided_or_alive_is_ever_freed(state: str, age: float, ours: bool, members: list[str],
                                                provisioned: set[str]) -> None:
    entries = tuple(_entry(m, "t") for m in members)
    verdict = judge(Attempt("t", state, age, entries), grace_s=GRACE,  # type: ignore[arg-type]
                    ours={"t"} if ours else set(), provisioned=provisioned)
    if verdict.action == "release":
        # Only an Aborted attempt, or reservations nothing decides, past the grace and never made
        # into an ElasticGPU, are freed at once; a Committing one must be aborted first.
        assert state == "Aborted" or (state == "Gone" and age >= GRACE)
        assert all(e.key not in provisioned for e in verdict.release) or state == "Aborted"
    if state == "Complete":
        assert verdict.action == "keep"
    if state == "Committing" and age < GRACE and not ours:
        assert verdict.action == "wait" and 0 < verdict.wait_s <= GRACE
    if verdict.action == "abort":
        assert state == "Committing"
