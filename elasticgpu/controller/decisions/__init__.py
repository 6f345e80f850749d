"""Decisions: pure functions and state machines that say what should happen, never do it.

`binder` (a claim's state machine), `release` (what a released or deleted claim frees),
`resync` (what a periodic resync repairs), `gpu_health` (a GPU ready for reservations, or failed
for good), `gpu_step` (one GPU sync's next step, `gpu_health`'s rules in order), `pod_gate` (a
gated pod's next step, its lift patch), `cards_assigned` (a translated pod's one Event: its name
and message).

May import: `elasticgpu.api`, `elasticgpu.allocator`, the controller's `settings` and `errors`.
Never: the picture, the edge, the flow, the pods, the process, any client or HTTP (import-linter
contracts in pyproject.toml). The picture's objects come in as parameters (`resync.GPUs`).
"""
