"""Rules for names, references and selectors, each written once for both enforcers.

A rule object gives the CRD its schema piece (`crd()`: a length bound and a CEL rule) and
Python its check (`check()`: raises `InvalidSpec`), with the same field name and the same words,
so `kubectl apply` and the controller refuse the same values with the same message. The regexes
are plain RE2/Python syntax (no look-around, no backslashes) so CEL's `matches` and `re` agree.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elasticgpu.api.errors import InvalidSpec
from elasticgpu.api.schema import crd_field, rule

# Kubernetes' DNS-1123 subdomain (object names such as ElasticGPUs, classes and GPUs).
DNS_SUBDOMAIN_MAX = 253
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = f"^{_LABEL}([.]{_LABEL})*$"
DNS_SUBDOMAIN_RULE = (
    "must be a DNS-1123 subdomain: lower case letters, digits, '-' and '.', starting and ending with a letter"
    f" or digit, at most {DNS_SUBDOMAIN_MAX} characters"
)

# A qualified name `domain/name`, as a StorageClass provisioner (`kubernetes.io/aws-ebs`): the
# domain a DNS-1123 subdomain, the name at most 63 letters, digits, '-', '_' or '.'.
QUALIFIED_NAME_MAX = DNS_SUBDOMAIN_MAX + 1 + 63
QUALIFIED_NAME = f"^{_LABEL}([.]{_LABEL})*/[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
QUALIFIED_NAME_RULE = (
    "must be a qualified name domain/name such as elasticgpu.io/gpushare: a DNS-1123 subdomain, a '/',"
    " then at most 63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit"
)

_DNS_RE = re.compile(DNS_SUBDOMAIN)
_QUALIFIED_RE = re.compile(QUALIFIED_NAME)


def is_dns_subdomain(value: str) -> bool:
    """True for a valid Kubernetes object name (DNS-1123 subdomain)."""
    return len(value) <= DNS_SUBDOMAIN_MAX and _DNS_RE.fullmatch(value) is not None


def is_qualified_name(value: str) -> bool:
    """True for `domain/name` (domain a DNS-1123 subdomain, name a qualified-name part)."""
    domain, _, _ = value.partition("/")
    return len(domain) <= DNS_SUBDOMAIN_MAX and _QUALIFIED_RE.fullmatch(value) is not None


@dataclass(frozen=True)
class NameRule:
    """One name-valued field: `field` is its path as users see it, `text` the rule in words."""

    field: str
    text: str = DNS_SUBDOMAIN_RULE
    qualified: bool = False

    @property
    def message(self) -> str:
        """The message both enforcers give."""
        return f"{self.field}: {self.text}"

    def cel(self) -> dict[str, str]:
        """The CEL rule for `self` being the string."""
        if self.qualified:
            # indexOf('/') is the domain's length: RE2 cannot bound a repeated group's total length.
            expression = f"self.matches('{QUALIFIED_NAME}') && self.indexOf('/') <= {DNS_SUBDOMAIN_MAX}"
        else:
            expression = f"self.matches('{DNS_SUBDOMAIN}')"
        return rule(expression, self.message, reason="FieldValueInvalid")

    def crd(self) -> dict[str, Any]:
        """`json_schema_extra` of the field: a length bound (it also bounds the CEL cost) and the rule."""
        longest = QUALIFIED_NAME_MAX if self.qualified else DNS_SUBDOMAIN_MAX
        return crd_field(maxLength=longest, **{"x-kubernetes-validations": [self.cel()]})

    def check(self, value: str | None) -> None:
        """Raise `InvalidSpec` when `value` is set and breaks the rule."""
        if value is None:
            return
        valid = is_qualified_name(value) if self.qualified else is_dns_subdomain(value)
        if not valid:
            raise InvalidSpec(field=self.field, rule=self.text, value=value)


# -- selectors ----------------------------------------------------------------------------------

VALUES_REQUIRED = "must list at least one value when operator is In or NotIn"
VALUES_FORBIDDEN = "must be empty when operator is Exists or DoesNotExist"
VALUES_ONE = "must be exactly one value when operator is Gt or Lt"


def selector_value_rules(*, numeric: bool) -> list[dict[str, str]]:
    """CEL rules of one requirement (`key`, `operator`, `values`); `numeric` adds Gt and Lt.
    `fieldPath` makes the server name `...matchExpressions[i].values` itself."""
    rules = [
        rule(
            "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
            f"values: {VALUES_REQUIRED}",
            reason="FieldValueRequired",
            field_path=".values",
        ),
        rule(
            "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
            f"values: {VALUES_FORBIDDEN}",
            reason="FieldValueForbidden",
            field_path=".values",
        ),
    ]
    if numeric:
        rules.append(
            rule(
                "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1)",
                f"values: {VALUES_ONE}",
                reason="FieldValueInvalid",
                field_path=".values",
            )
        )
    return rules


def check_selector_values(operator: str, values: Sequence[str], *, field: str) -> None:
    """Python twin of `selector_value_rules`; `field` is the requirement's path."""
    where = f"{field}.values"
    if operator in ("In", "NotIn") and not values:
        raise InvalidSpec(field=where, rule=VALUES_REQUIRED)
    if operator in ("Exists", "DoesNotExist") and values:
        raise InvalidSpec(field=where, rule=VALUES_FORBIDDEN, value=list(values))
    if operator in ("Gt", "Lt") and len(values) != 1:
        raise InvalidSpec(field=where, rule=VALUES_ONE, value=list(values))
