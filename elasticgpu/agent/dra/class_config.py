"""The isolation mode of a prepared ResourceClaim, from the opaque config of its allocation (issue 48).

The scheduler copies into `status.allocation.devices.config` the opaque configs that apply to the
claim's requests: those of the DeviceClass (`source: FromClass`, written by the platform team) and those
of the claim itself (`source: FromClaim`, written by the tenant). Ours, for driver `gpu.elasticgpu.io`:

    {"apiVersion": "gpu.elasticgpu.io/v1", "kind": "Isolation", "mode": "MPS"}     mode: None, MPS, HAMiCore

The mode is the class's: it is what the platform team promised the card's other tenants. A claim's own
Isolation config is refused unless it names the class's mode (a tenant must not weaken the class's
isolation, e.g. `None` on an `MPS` class, and choosing a stronger one is the class's call too): the
claim's answer names the field and the fix, kubelet shows it in the pod's events. A class without one is
mode None (the advisory env of the claim's CDI spec). Configs of other drivers are not ours to read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from elasticgpu.agent.isolation import base
from elasticgpu.api import dra_names

API_VERSION = f"{dra_names.DRIVER_NAME}/v1"
KIND = "Isolation"
MODES = (base.MODE_NONE, base.MODE_MPS, base.MODE_HAMI_CORE)
FROM_CLASS = "FromClass"
FROM_CLAIM = "FromClaim"


class ConfigRefused(Exception):
    """The claim's config cannot be served; the message names the field and the fix."""


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


def isolation_mode(allocation: Mapping[str, Any], requests: Iterable[str], *, claim: str) -> str:
    """The mode of the claim's requests `requests` (see the module docstring); raises ConfigRefused."""
    requests = list(requests)
    modes: dict[str, set[str]] = {FROM_CLASS: set(), FROM_CLAIM: set()}
    for config in (allocation.get("devices") or {}).get("config") or []:
        parameters = _ours(config, requests)
        if parameters is None or parameters.get("kind") != KIND:
            continue
        source = config.get("source")
        owner = "DeviceClass" if source == FROM_CLASS else "claim"
        where = f"{claim}: the {owner}'s config for {dra_names.DRIVER_NAME}"
        if parameters.get("apiVersion") != API_VERSION:
            raise ConfigRefused(f"{where} has apiVersion {parameters.get('apiVersion')!r}; write {API_VERSION!r}")
        mode = parameters.get("mode")
        if mode not in MODES:
            raise ConfigRefused(f"{where} names isolation mode {mode!r}; use one of {', '.join(MODES)}")
        modes.setdefault(str(source), set()).add(str(mode))
    if len(modes[FROM_CLASS]) > 1:
        named = ", ".join(sorted(modes[FROM_CLASS]))
        raise ConfigRefused(f"{claim}: its DeviceClasses name several isolation modes ({named}) for one claim;"
                            " give its requests classes of one mode")
    mode = next(iter(modes[FROM_CLASS]), base.MODE_NONE)
    asked = modes[FROM_CLAIM] - {mode}
    if asked:
        raise ConfigRefused(
            f"{claim}: spec.devices.config asks isolation mode {', '.join(sorted(asked))} for driver"
            f" {dra_names.DRIVER_NAME}, but its DeviceClass gives {mode}: the isolation of a card's slices is the"
            " platform team's (the class's), not the claim's. Remove the Isolation config from the claim, or use a"
            " DeviceClass of the mode you need"
        )
    return mode
