"""CEL rules (`x-kubernetes-validations`) shared by several kinds.

They mirror `resources.parse_resource_map`, so `kubectl apply` refuses at once what the
controller would refuse later; tests check that both agree on the invalid corpus.
"""

from __future__ import annotations

from elasticgpu.api import names
from elasticgpu.api.schema import rule

_CORE = names.RESOURCE_CORE
_MEMORY = names.RESOURCE_MEMORY
_NVIDIA = names.RESOURCE_NVIDIA_GPU
_RDMA = names.RESOURCE_RDMA
_KNOWN = ", ".join(f"'{name}'" for name in names.KNOWN_RESOURCES)
# A quantity that `parse_memory_mib` accepts (no milli, no exponent) with a non-zero digit: a
# bare number is whole MiB (`10`, `10.0`), a fraction needs a suffix (`1.5Gi`).
_MEMORY_TEXT = r"^[+]?([0-9]+([.]0*)?|([0-9]+([.][0-9]*)?|[.][0-9]+)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P))$"


# CEL keywords; Kubernetes escapes properties of these names as `__name__` (e.g. `namespace`).
_RESERVED = frozenset(
    {
        "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
        "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
    }
)  # fmt: skip


def identifier(field: str) -> str:
    """The CEL spelling of a property name (`namespace` -> `__namespace__`)."""
    return f"__{field}__" if field in _RESERVED else field


def _as_text(key: str) -> str:
    # Map values are int-or-string: compare them as text so one rule covers both.
    return f"string(self['{key}'])"


def resource_map_rules(field: str) -> list[dict[str, str]]:
    """Rules for one resource map (`requests`, `limits`, `capacity`) at path `field`."""
    core = _as_text(_CORE)
    memory = _as_text(_MEMORY)
    nvidia = _as_text(_NVIDIA)
    return [
        rule(
            f"self.all(k, k in [{_KNOWN}])",
            f"{field}: only {', '.join(names.KNOWN_RESOURCES)} can be requested",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!('{_CORE}' in self) || ({core}.matches('^[0-9]+$') && int({core}) >= 1"
            f" && (int({core}) <= 100 || int({core}) % 100 == 0))",
            f"{field}[{_CORE}]: must be 1..100 (a share of one card) or a multiple of 100 (whole cards)",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!('{_MEMORY}' in self) || ({memory}.matches('{_MEMORY_TEXT}') && {memory}.matches('[1-9]'))",
            f"{field}[{_MEMORY}]: must be more than 0, as MiB or a quantity such as 10Gi",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!('{_NVIDIA}' in self) || ({nvidia}.matches('^[0-9]+$') && int({nvidia}) >= 1)",
            f"{field}[{_NVIDIA}]: must be a whole number of cards, at least 1",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!('{_RDMA}' in self) || ({_as_text(_RDMA)}.matches('^[0-9]+$') && int({_as_text(_RDMA)}) >= 1"
            f" && ('{_NVIDIA}' in self || ('{_CORE}' in self && int({core}) >= 100)))",
            f"{field}[{_RDMA}]: must be a whole number of NICs, at least 1, with whole cards",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!('{_NVIDIA}' in self && '{_CORE}' in self) || int({core}) == 100 * int({nvidia})",
            f"{field}: {_CORE} must equal 100 x {_NVIDIA} when both are set",
            reason="FieldValueInvalid",
        ),
    ]


NON_EMPTY_MAP = f"must request at least one of {', '.join(names.KNOWN_RESOURCES)}"


def non_empty_map(field: str) -> dict[str, str]:
    """A resource map must ask for something."""
    return rule("size(self) > 0", f"{field}: {NON_EMPTY_MAP}", reason="FieldValueRequired")


def set_once(field: str, path: str) -> dict[str, str]:
    """A field that may be set once (by the user or on bind) and never changed or cleared."""
    return rule(
        f"!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})",
        f"{path}.{field}: cannot be changed or removed once set",
        reason="FieldValueForbidden",
    )


def immutable(field: str, path: str, fix: str) -> dict[str, str]:
    """A field that may never change after creation, present or absent."""
    return rule(
        f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})",
        f"{path}{field}: is immutable; {fix}",
        reason="FieldValueForbidden",
    )


SAME_IF_BOTH = "must be equal when both are set (two spellings of one field)"


def same_if_both(first: str, second: str, path: str) -> dict[str, str]:
    """Two spellings of one field (ours and upstream elastic-gpu's) must agree when both are set."""
    return rule(
        f"!has(self.{first}) || !has(self.{second}) || self.{first} == self.{second}",
        f"{path}{first} and {path}{second}: {SAME_IF_BOTH}",
        reason="FieldValueInvalid",
    )


# A memory value as a quantity CEL can compare: a bare number is MiB (as `parse_memory_mib`
# reads it), so it gets the suffix; anything else is a Kubernetes quantity already.
_BARE_NUMBER = "^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)$"


def _memory_quantity(value: str) -> str:
    return f"({value}.matches('{_BARE_NUMBER}') ? {value} + 'Mi' : {value})"


def limits_not_below_requests(path: str) -> list[dict[str, str]]:
    """Rules on a ResourceRequirements object at `path`: limits of cores and memory are not below
    the requests. Values the resource map rules refuse anyway are left to those rules."""
    both = "has(self.requests) && has(self.limits) && '{key}' in self.requests && '{key}' in self.limits"
    request_core = f"string(self.requests['{_CORE}'])"
    limit_core = f"string(self.limits['{_CORE}'])"
    request_memory = _memory_quantity(f"string(self.requests['{_MEMORY}'])")
    limit_memory = _memory_quantity(f"string(self.limits['{_MEMORY}'])")
    return [
        rule(
            f"!({both.format(key=_CORE)}) || !{request_core}.matches('^[0-9]+$')"
            f" || !{limit_core}.matches('^[0-9]+$') || int({limit_core}) >= int({request_core})",
            f"{path}.limits[{_CORE}]: must not be below the request ({path}.requests[{_CORE}])",
            reason="FieldValueInvalid",
        ),
        rule(
            f"!({both.format(key=_MEMORY)}) || !isQuantity({request_memory}) || !isQuantity({limit_memory})"
            f" || quantity({limit_memory}).compareTo(quantity({request_memory})) >= 0",
            f"{path}.limits[{_MEMORY}]: must not be below the request ({path}.requests[{_MEMORY}])",
            reason="FieldValueInvalid",
        ),
    ]
