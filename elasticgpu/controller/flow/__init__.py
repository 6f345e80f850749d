"""The flow: what moves objects from a watch event to a write on the server, in rooms by the behaviour
each carries out. From the bottom up (a room imports only rooms below it; pyproject.toml's contract):

- `machinery/`: the watch machinery, which knows no behaviour: `informer` (list and watch; feeds the
  picture), `namespace_weight_feed`, `workqueue`, `settled` (which keys the resync may leave alone),
  `events`, `failures` (what a failed sync does), `handoff` (writes after the commit point, on a
  pool), `liveness` (threads alive, loops stepping);
- `quota_guard` (quota charges, checked at the commit) and `mig_binding` (a MIG instance's place):
  one module each, used by binding;
- `binding/`: a claim bound to an ElasticGPU: `claim_status` (status writes and Events),
  `claim_binding` (the bind steps), `reserving` (the reservation, step 1), `commit` (the commit
  point), `provisioner` (the ElasticGPU made for a claim), `elasticgpu_sync`, `releasing`
  (deletion), `policing_copy` (the class's policy in the claim's status). It knows nothing of
  groups or preemption: `reserving` asks them through Protocols of its own;
- `groups/` (claim groups, all or none, and the room kept for starved waiters), `preemption/`
  (priorities and victims) and `elastic/` (resizing and recommending Bound claims): each calls
  into binding, none into another;
- on top: `claim_sync` (a claim's next step: wires binding, groups, preemption and elastic),
  `repair` (the periodic resync), `gpu_sync` (a GPU's readiness).

May import: decisions, the picture, the edge (to write), the shared modules. Never: the pods, the
process, the kubernetes client or `http` directly (only through the edge).
"""
