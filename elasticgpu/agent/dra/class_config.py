"""The isolation and the over-limit policy of a prepared ResourceClaim, from the opaque config of its allocation
(issue 48).

The scheduler copies into `status.allocation.devices.config` the opaque configs that apply to the
claim's requests: those of the DeviceClass (`source: FromClass`, written by the platform team) and those
of the claim itself (`source: FromClaim`, written by the tenant). Ours, for driver `gpu.elasticgpu.io`:

    {"apiVersion": "gpu.elasticgpu.io/v1", "kind": "Isolation", "mode": "MPS",
     "overLimitAction": "StopContainer", "overLimitGraceSeconds": 60}

    mode                   None (default), MPS, HAMiCore: how a slice's limits are enforced in the container
    overLimitAction        Warn (default) or StopContainer: what policing does with a claim over its memory,
    overLimitGraceSeconds  60 (default), 0 or more     the same values and meaning as a GPUClass's fields of
                                                       these names (elasticgpu/api/policing.py)

Each field is the class's: it is what the platform team promised the card's other tenants. A claim's own
config is refused where it names a value other than the class's (a tenant must not weaken the class's
isolation or policing, e.g. mode `None` on an `MPS` class or `Warn` on a `StopContainer` one, and choosing a
stronger one is the class's call too): the claim's answer names the field and the fix, kubelet shows it in
the pod's events. A field a config leaves out is not said: a class without it gets the default. Configs of
other drivers are not ours to read; a key we do not know is refused (a misspelt field must not silently
leave the default in force).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from elasticgpu.agent.isolation import base
from elasticgpu.api import dra_names
from elasticgpu.api import policing as api_policing

API_VERSION = f"{dra_names.DRIVER_NAME}/v1"
KIND = "Isolation"
MODES = (base.MODE_NONE, base.MODE_MPS, base.MODE_HAMI_CORE)
FROM_CLASS = "FromClass"
FROM_CLAIM = "FromClaim"
MODE = "mode"
ACTION = "overLimitAction"
GRACE = "overLimitGraceSeconds"
KEYS = ("apiVersion", "kind", MODE, ACTION, GRACE)
DEFAULTS: dict[str, object] = {MODE: base.MODE_NONE, ACTION: api_policing.DEFAULT_OVER_LIMIT_ACTION,
                               GRACE: api_policing.DEFAULT_OVER_LIMIT_GRACE_S}  # fmt: skip
_WHAT = {MODE: "isolation mode", ACTION: "over-limit action", GRACE: "over-limit grace (seconds)"}
_WHOSE = {MODE: "the isolation of a card's slices", ACTION: "the policing of a card's slices",
          GRACE: "the policing of a card's slices"}  # fmt: skip


class ConfigRefused(Exception):
    """The claim's config cannot be served; the message names the field and the fix."""


@dataclass(frozen=True, kw_only=True)
class ClassConfig:
    """What a claim's DeviceClass says of its slices (see the module docstring)."""

    mode: str = base.MODE_NONE
    over_limit_action: api_policing.OverLimitAction = api_policing.DEFAULT_OVER_LIMIT_ACTION
    over_limit_grace_s: int = api_policing.DEFAULT_OVER_LIMIT_GRACE_S


def _ours(config: Mapping[str, Any], requests: Iterable[str]) -> Mapping[str, Any] | None:
    """The parameters of an opaque config of our driver that applies to one of `requests`, else None."""
    opaque = config.get("opaque") or {}
    if opaque.get("driver") != dra_names.DRIVER_NAME:
        return None
    scoped = config.get("requests") or []
    # A request of a claim is named `<request>` or `<request>/<subrequest>` (prioritized lists).
    if scoped and not any(r in scoped or r.split("/", 1)[0] in scoped for r in requests):
        return None
    parameters = opaque.get("parameters")
    return parameters if isinstance(parameters, Mapping) else {}


def _checked(parameters: Mapping[str, Any], where: str) -> dict[str, object]:
    """The fields `parameters` names, each checked; raises ConfigRefused naming the field and the fix."""
    if parameters.get("apiVersion") != API_VERSION:
        raise ConfigRefused(f"{where} has apiVersion {parameters.get('apiVersion')!r}; write {API_VERSION!r}")
    unknown = sorted(str(k) for k in parameters if k not in KEYS)
    if unknown:
        raise ConfigRefused(f"{where} has unknown field(s) {', '.join(unknown)}; its fields are {', '.join(KEYS)}")
    said = {k: parameters[k] for k in (MODE, ACTION, GRACE) if k in parameters}
    if MODE in said and said[MODE] not in MODES:
        raise ConfigRefused(f"{where} names isolation mode {said[MODE]!r}; use one of {', '.join(MODES)}")
    if ACTION in said and said[ACTION] not in api_policing.OVER_LIMIT_ACTIONS:
        raise ConfigRefused(f"{where} names {ACTION} {said[ACTION]!r}; use one of"
                            f" {', '.join(api_policing.OVER_LIMIT_ACTIONS)}")  # fmt: skip
    grace = said.get(GRACE)
    if GRACE in said and (isinstance(grace, bool) or not isinstance(grace, int) or grace < 0):
        raise ConfigRefused(f"{where} names {GRACE} {grace!r}: {api_policing.GRACE_RANGE}")
    return said


def read(allocation: Mapping[str, Any], requests: Iterable[str], *, claim: str) -> ClassConfig:
    """What the class says for the claim's requests `requests` (see the module docstring); raises ConfigRefused."""
    requests = list(requests)
    said: dict[str, dict[str, set[object]]] = {FROM_CLASS: {}, FROM_CLAIM: {}}
    for config in (allocation.get("devices") or {}).get("config") or []:
        parameters = _ours(config, requests)
        if parameters is None or parameters.get("kind") != KIND:
            continue
        source = FROM_CLASS if config.get("source") == FROM_CLASS else FROM_CLAIM
        owner = "DeviceClass" if source == FROM_CLASS else "claim"
        for key, value in _checked(parameters, f"{claim}: the {owner}'s config for {dra_names.DRIVER_NAME}").items():
            said[source].setdefault(key, set()).add(value)
    chosen: dict[str, object] = {}
    for key, default in DEFAULTS.items():
        by_class = said[FROM_CLASS].get(key, set())
        if len(by_class) > 1:
            named = ", ".join(sorted(str(v) for v in by_class))
            raise ConfigRefused(f"{claim}: its DeviceClasses name several {_WHAT[key]}s ({named}) for one claim;"
                                f" give its requests classes of one {_WHAT[key]}")  # fmt: skip
        value = chosen[key] = next(iter(by_class), default)
        asked = said[FROM_CLAIM].get(key, set()) - {value}
        if asked:
            raise ConfigRefused(
                f"{claim}: spec.devices.config asks {_WHAT[key]} {', '.join(sorted(str(v) for v in asked))} for driver"
                f" {dra_names.DRIVER_NAME}, but its DeviceClass gives {value}: {_WHOSE[key]} is the platform team's"
                f" (the class's), not the claim's. Remove {key} from the claim's Isolation config, or use a"
                f" DeviceClass that gives the {_WHAT[key]} you need"
            )
    action: api_policing.OverLimitAction = "StopContainer" if chosen[ACTION] == "StopContainer" else "Warn"
    grace = chosen[GRACE]
    return ClassConfig(mode=str(chosen[MODE]), over_limit_action=action,
                       over_limit_grace_s=grace if isinstance(grace, int) else api_policing.DEFAULT_OVER_LIMIT_GRACE_S)


def isolation_mode(allocation: Mapping[str, Any], requests: Iterable[str], *, claim: str) -> str:
    """The isolation mode alone (`read(...).mode`); raises ConfigRefused."""
    return read(allocation, requests, claim=claim).mode
