"""Pods that use claims: from a gated pod's annotations to its gate lift.

`pod_sync` (a gated pod's sync), `pod_placement` (pure: the node of a pod's WaitForFirstConsumer
claims), `pod_neighbours` (pure: the claims that must land beside a pod's), `inline_claims`
(claims owned by pods), `cards_event` (a translated pod's one `CardsAssigned` Event).

May import: decisions, the picture, the edge (through the flow's writers too), the flow, the
shared modules. Never: the process, the kubernetes client or `http` directly.
"""
