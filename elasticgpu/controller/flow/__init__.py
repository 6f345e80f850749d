"""The flow: what moves objects from a watch event to a write on the server.

`informer` (list and watch; feeds the picture), `workqueue`, `claim_sync` (a claim's next step,
carried out by `claim_status` (its status writes), `claim_binding` (the bind steps), `reserving`
(the reservation), `group_binding` (claim groups), `releasing` (deletion)), `elasticgpu_sync`,
`gpu_sync` (a GPU's readiness), `commit` (the reservation commit), `handoff` (writes after the
commit point, on a pool), `repair` (the periodic resync), `provisioner` (the ElasticGPU made for
a claim), `resizing` (a Bound claim resized in place), `events`, `failures` (what a failed sync
does), `liveness` (threads alive, loops stepping).

May import: decisions, the picture, the edge (to write), the shared modules. Never: the pods, the
process, the kubernetes client or `http` directly (only through the edge).
"""
