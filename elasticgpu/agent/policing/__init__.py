"""Over-limit policing (issue 25): a claim that stays over its memory for its class's grace has its
container stopped through the runtime. `decisions` is the pure rule (one `Watch` per claim),
`enforcing` carries it out after each usage pass (StopContainer, Events, the stop counter).
"""

from elasticgpu.agent.policing.decisions import Policy, Sample, Stop, Watch, choose, confirm, observe
from elasticgpu.agent.policing.enforcing import REASON_STOPPED, ContainerStopper, Enforcer, policy_of

__all__ = [
    "REASON_STOPPED",
    "ContainerStopper",
    "Enforcer",
    "Policy",
    "Sample",
    "Stop",
    "Watch",
    "choose",
    "confirm",
    "observe",
    "policy_of",
]
