"""The exceptions of elasticgpu's controller.

    ElasticGPUError (elasticgpu.api.errors)
    ├── NotFound (elasticgpu.api.errors)   the object is not on the server (HTTP 404)
    └── ControllerError                    base of what the controller raises on purpose
        ├── ApiError                       the API server refused or failed a call
        │   ├── Conflict                   the object changed since it was read (HTTP 409): re-read, re-plan
        │   │   ├── AlreadyExists          a create found the name taken (HTTP 409, reason AlreadyExists)
        │   │   └── CardOverfilled         a write would put a card over its capacity (no call made): re-plan
        │   ├── Rejected                   the server refused the object (HTTP 400/422: schema or CEL rule)
        │   ├── EvictionBlocked            an eviction was refused for now (HTTP 429: a PodDisruptionBudget)
        │   └── ApiUnavailable             the server could not be reached or failed (5xx, timeouts)
        └── BindingError                   a decision cannot be carried out; the next sync retries

`edge/kube.py` is the only place that sees `kubernetes.client.ApiException`; it translates every
failure into this tree, so the rest of the controller never imports the client library.
"""

from __future__ import annotations

from elasticgpu.api.errors import ElasticGPUError, NotFound

__all__ = ["AlreadyExists", "ApiError", "ApiUnavailable", "BindingError", "CardClosed", "CardOverfilled", "Conflict",
           "ControllerError", "ElasticGPUError", "EvictionBlocked", "NotFound", "Rejected"]


class ControllerError(ElasticGPUError):
    """Base of the controller's errors."""


class ApiError(ControllerError):
    """A call to the API server failed. `status` is the HTTP status (0 when none came back)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


class Conflict(ApiError):
    """The object changed since it was read (resourceVersion precondition failed)."""


class AlreadyExists(Conflict):
    """A create found the name taken."""


class CardOverfilled(Conflict):
    """A reservation's write would put its card over 100% cores or its memory: the card changed
    in the picture between the decision and the write (another controller's write arrived), and
    the write, carrying the picture's newest resourceVersion, would pass the server's precondition.
    Nothing was written; re-plan on the card as it is now, as after a 409."""


class CardClosed(CardOverfilled):
    """A new reservation's card is no longer ours alone in the picture (its spec.owner or status.owner
    says DRA, docs/dra.md): the platform team started a move between the decision and the write, and
    the write, carrying the picture's newest resourceVersion, would pass the server's precondition
    (the CRD refuses a reservation only once status.owner is DRA). Nothing was written; re-plan, as
    after a 409 (a subclass of CardOverfilled so that every writer already re-plans on it)."""


class Rejected(ApiError):
    """The API server refused the object: a schema or CEL rule of the CRD, or a bad request."""


class EvictionBlocked(ApiError):
    """The eviction API refused to evict a pod for now (HTTP 429): a PodDisruptionBudget allows no
    disruption at the moment. Retry later; the budget is honoured, never bypassed."""


class ApiUnavailable(ApiError):
    """The server could not be reached, timed out, or failed (5xx)."""


class BindingError(ControllerError):
    """A binding step cannot be carried out now; nothing was saved and the next sync retries."""
