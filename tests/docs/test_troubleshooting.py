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


def test_the_page_starts_from_symptoms_too() -> None:
    """Issue 29: what a user sees first, each with where to look and what to do."""
    text = PAGE.read_text()
    sections = {title: body for title, body in
                (part.split("\n", 1) for part in text.split("\n### ")[1:])}
    wanted = {
        "My claim is Pending with `NoCapacity`, and the cluster has GPUs":
            ("kubectl get pgpu", "nodeSelector", "/etc/elasticgpu/kubeconfig", "systemctl status elasticgpu-agent"),
        "REASON is empty": ("Bound", "lease", "provisioner"),
        "My pod shows `SchedulingGated`": ("elasticgpu.io/ClaimsReady", "schedulingGates", "CreateContainerError"),
    }
    for title, words in wanted.items():
        assert title in sections, f"no section '### {title}' in {PAGE.name}"
        missing = [w for w in words if w not in sections[title]]
        assert not missing, (title, missing)
