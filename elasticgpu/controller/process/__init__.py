"""The process: the rooms wired into one running controller.

`reconciling` (the roles wired into one `Controller`), `worker` (the loop that dispatches keys to
the syncs), `startup` (`run_controller`), `starting` (the first list and the threads after it:
shared by both watch engines), `operator` (kopf wiring), `operability` (leader election,
/healthz, /readyz, /metrics), `health` (their HTTP server), `garbage` (collector tuning); log
formats are `elasticgpu.logs`.

May import every room and kopf. Never the kubernetes client directly: leases come from
`edge.leader`. `operator` never imports `startup` (import-linter contract).
"""
