"""The exceptions of the admission webhook.

    WebhookError         base of what the webhook raises on purpose
    ├── Conflict         a write lost a race (409): re-read and decide again
    ├── Forbidden        RBAC refused (403): the message names the Role rule and the fix
    ├── ApiUnavailable   the API server did not answer, or refused for another reason
    └── TranslationRefused  a pod's GPU resources cannot become its claims (`translating`)

`publishing` translates every failure of the Kubernetes client into one of these, so the rest
of the package never sees a third-party exception.
"""

from __future__ import annotations


class WebhookError(Exception):
    """Base of the webhook's own errors."""


class Conflict(WebhookError):
    """The object changed (or appeared) since it was read; the caller re-reads it."""


class ApiUnavailable(WebhookError):
    """The API server could not be reached or answered with an error."""


class Forbidden(WebhookError):
    """RBAC refused a call (403): the webhook's ServiceAccount lacks a rule; retried, since an admin
    may grant it while the webhook runs, and said once with the rule that is missing."""


class TranslationRefused(WebhookError):
    """A pod's device-plugin resources cannot be translated: the message names the object, the field and the fix."""
