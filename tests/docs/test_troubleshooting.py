"""docs/troubleshooting.md names every reason the controller, the webhook and the agent can write."""

from __future__ import annotations

from tests.docs import collect

PAGE = collect.ROOT / "docs" / "troubleshooting.md"


def test_every_reason_the_code_writes_is_in_troubleshooting() -> None:
    text = PAGE.read_text()
    found = collect.reasons()
    # The collector itself must keep working: these are written today by controller and agent.
    assert {"NoCapacity", "ClaimsBound", "HeartbeatExpired", "OverLimit", "PrivilegedWithoutClaim"} <= {
        r.text for r in found}
    missing = sorted({
        f"{r.text}{'<...>' if r.prefix else ''} ({r.where})"
        for r in found
        # An f-string's reason (`Xid{code}`) is documented as `Xid<code>`.
        if (f"`{r.text}<" if r.prefix else f"`{r.text}`") not in text
    })
    assert not missing, f"reasons missing from {PAGE.relative_to(collect.ROOT)}: add a row for each: {missing}"
