"""The picture: what the watches delivered, kept small and indexed, and the GPU ledger.

`picture` (objects by key and their indexes; `Picture`), `reading` (its maps and their readers),
`reservations` (the GPU ledger: the allocator's inventory mirrored from GPU objects, and the status
bodies that commit or free a reservation), `versions` (resourceVersion order, tombstones),
`records` and `compact` (how bodies and models are stored small), `pod_index` (pods and nodes),
`namespace_weights` (the FairShare weight of each namespace).

May import: decisions, `elasticgpu.api`, `elasticgpu.allocator`, the controller's shared modules.
Never: the edge, the flow, the pods, the process, any client or HTTP. It does no I/O: callers
write, then feed the server's answer back (`observe_gpu`, `gpu_written`).
"""
