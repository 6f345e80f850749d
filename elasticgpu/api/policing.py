"""What happens to a claim's container that uses more GPU memory than its slice: the class decides.

A class says it with two top-level fields, `overLimitAction` (Warn | StopContainer) and
`overLimitGraceSeconds`. The agent cannot read classes (its RBAC reads only claims and
ElasticGPUs, by name), so the controller copies both into the claim's `status.policing` when it
binds the claim, and keeps them true to the class while the claim is Bound; the agent reads them
there. A claim without `status.policing` (bound before the fields existed) is only warned about.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from elasticgpu.api.schema import SCHEMA_DEFAULT, KubeModel, crd_field, rule

OverLimitAction = Literal["Warn", "StopContainer"]
OVER_LIMIT_ACTIONS: tuple[OverLimitAction, ...] = ("Warn", "StopContainer")
DEFAULT_OVER_LIMIT_ACTION: OverLimitAction = "Warn"
DEFAULT_OVER_LIMIT_GRACE_S = 60
GRACE_RANGE = (
    "must be 0 or more (seconds a claim's memory stays over its slice, without a sample under it,"
    " before its container is stopped); 0 stops at the first sample over"
)

ACTION_DESCRIPTION = (
    "What the node agent does when a claim of this class uses more GPU memory than it reserved: Warn"
    " (default: the claim's OverLimit condition and a Warning Event) or StopContainer (also stop the"
    " offending container through the runtime once the memory stayed over for overLimitGraceSeconds;"
    " kubelet then applies the pod's restart policy)."
)
GRACE_DESCRIPTION = (
    "Seconds a claim's memory must stay over its slice, every sample of them, before StopContainer acts"
    " (default 60; 0 or more). A sample under the slice starts the count again."
)


def grace_rules(field: str) -> list[dict[str, str]]:
    """The CEL rule of a grace field (class or claim status), with a message that names `field`."""
    return [rule("self >= 0", f"{field}: {GRACE_RANGE}", reason="FieldValueInvalid")]


class Policing(KubeModel):
    """The class's over-limit policy as the controller copied it into a Bound claim's status."""

    over_limit_action: OverLimitAction = Field(
        default=DEFAULT_OVER_LIMIT_ACTION, description=ACTION_DESCRIPTION,
        json_schema_extra=crd_field(**{SCHEMA_DEFAULT: True}),
    )
    over_limit_grace_seconds: int = Field(
        default=DEFAULT_OVER_LIMIT_GRACE_S, description=GRACE_DESCRIPTION,
        json_schema_extra=crd_field(**{
            SCHEMA_DEFAULT: True, "x-kubernetes-validations": grace_rules("status.policing.overLimitGraceSeconds")}),
    )
