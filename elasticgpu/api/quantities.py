"""Kubernetes quantities as elasticgpu reads them: GPU memory in MiB, counts as integers."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from elasticgpu.api.errors import InvalidQuantity

_MIB = 1024 * 1024
# Binary and decimal suffixes of Kubernetes quantities, as byte multipliers.
_SUFFIXES: dict[str, Decimal] = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
}
_QUANTITY = re.compile(r"^\s*([+]?[0-9]+(?:\.[0-9]*)?|[+]?\.[0-9]+)([A-Za-z]*)\s*$")


def parse_memory_mib(value: object, *, field: str) -> int:
    """Read GPU memory as whole MiB.

    A bare number (int or numeric string) is MiB, as in the original elastic-gpu; a string with
    a suffix is a Kubernetes byte quantity (`8Gi` = 8192, `10G` = 9537, rounded up to whole MiB).
    """
    if isinstance(value, bool):
        raise InvalidQuantity(field=field, rule="must be a MiB integer or a quantity such as 10Gi", value=value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise InvalidQuantity(field=field, rule="a bare number is MiB and must be whole", value=value)
        return int(value)
    if not isinstance(value, str):
        raise InvalidQuantity(field=field, rule="must be a MiB integer or a quantity such as 10Gi", value=value)
    match = _QUANTITY.match(value)
    if match is None:
        raise InvalidQuantity(
            field=field, rule="is not a quantity", value=value, fix="write MiB as an integer or a quantity such as 10Gi"
        )
    number_text, suffix = match.groups()
    try:
        number = Decimal(number_text)
    except InvalidOperation as err:  # the regex makes this unreachable, kept for safety
        raise InvalidQuantity(field=field, rule="is not a number", value=value) from err
    if suffix == "":
        if number != number.to_integral_value():
            raise InvalidQuantity(field=field, rule="a bare number is MiB and must be whole", value=value)
        return int(number)
    multiplier = _SUFFIXES.get(suffix)
    if multiplier is None:
        raise InvalidQuantity(
            field=field,
            rule=f"unknown suffix {suffix!r}",
            value=value,
            fix="use one of " + ", ".join(_SUFFIXES),
        )
    return math.ceil(number * multiplier / _MIB)


def parse_count(value: object, *, field: str) -> int:
    """Read an integer count (cores percent, cards): an int or a numeric string, never a fraction."""
    if isinstance(value, bool):
        raise InvalidQuantity(field=field, rule="must be an integer", value=value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return int(value)
    raise InvalidQuantity(field=field, rule="must be an integer", value=value)


def format_memory(mib: int) -> str:
    """Show MiB the way users write it: `10Gi` when whole GiB, else `1536Mi`."""
    if mib % 1024 == 0 and mib > 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"
