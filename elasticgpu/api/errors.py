"""The exceptions of elasticgpu's API layer.

    ElasticGPUError                 base of everything elasticgpu raises on purpose
    ├── InvalidSpec                 a field of an object breaks a rule (names field, rule, fix)
    │   ├── InvalidQuantity         a quantity string cannot be read (`10 Gb`, `-1`)
    │   ├── InvalidRequest          a claim's resources make no valid request
    │   └── InvalidClassParameters  an ElasticGPUClass has unknown or malformed parameters
    ├── InvalidPodClaims            a pod's claim annotations are wrong (holds every InvalidSpec found)
    └── NotFound                    a referenced object does not exist

Every message names the object (where known), the field, the rule, and how to fix it, because
the controller copies it verbatim into a Condition and an Event that the user reads.
"""

from __future__ import annotations


class ElasticGPUError(Exception):
    """Base of all errors raised on purpose by elasticgpu."""


class InvalidSpec(ElasticGPUError):
    """A field breaks a rule. `field` is a dotted path such as `spec.resources.requests`."""

    def __init__(self, *, field: str, rule: str, value: object = None, fix: str = "") -> None:
        self.field = field
        self.rule = rule
        self.value = value
        self.fix = fix
        shown = f" (got {value!r})" if value is not None else ""
        hint = f"; {fix}" if fix else ""
        super().__init__(f"{field}: {rule}{shown}{hint}")


class InvalidQuantity(InvalidSpec):
    """A quantity cannot be parsed."""


class InvalidRequest(InvalidSpec):
    """A claim's requested resources do not form a valid request."""


class InvalidClassParameters(InvalidSpec):
    """An ElasticGPUClass's `parameters` are unknown or malformed."""


class InvalidPodClaims(ElasticGPUError):
    """A pod's claim annotations break rules; `problems` holds one `InvalidSpec` per broken rule,
    so the user sees every problem of the pod at once instead of one per attempt."""

    def __init__(self, problems: list[InvalidSpec], *, pod: str = "") -> None:
        self.problems = tuple(problems)
        where = f"pod {pod}: " if pod else ""
        super().__init__(where + "; ".join(str(problem) for problem in self.problems))


class NotFound(ElasticGPUError):
    """A referenced object does not exist."""

    def __init__(self, *, kind: str, name: str, namespace: str | None = None, fix: str = "") -> None:
        self.kind = kind
        self.name = name
        self.namespace = namespace
        where = f"{namespace}/{name}" if namespace else name
        hint = f"; {fix}" if fix else ""
        super().__init__(f"{kind} {where} not found{hint}")
