"""What each XID means for the card: the one table of XID codes in elasticgpu (pure data, no I/O).

In `api` because both sides read it: the agent decides a card's health by it, the controller
fails an ElasticGPU only for an XID that needs a reset.

Sources:
- NVIDIA, "Xid Errors", the Xid catalog for Ampere and newer GPUs, column "Resolution Bucket
  (Immediate Action)": https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
  (IGNORE, RESTART_APP, RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR).
- NVIDIA k8s-device-plugin, `internal/rm/health.go`: the XIDs it skips by default as application
  errors ("the GPU should still be healthy"): 13, 31, 43, 45, 68, 109. Every other XID marks its
  device Unhealthy for good, as in the DRA driver's NVMLDeviceHealthCheck.
- NVML `nvmlDeviceGetRemappedRows` / the field `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`: a pending
  row remap or recovery action is cleared by a reset, which is how the NVML backend sees one.

The four kinds, and what health does with them:

    INFORMATIONAL  the driver recorded something (a row remap, a high corrected-ECC rate):
                   counted, never fails the card
    APPLICATION    one program's error (illegal address, page fault of one context, ...):
                   counted and shown, never fails the card
    TRANSIENT      the card stumbled and the driver contained it: Unhealthy (no new
                   reservations) for a quiet period, then Healthy again on its own
    RESET          the card needs a GPU reset (or the node a reboot): Unhealthy until the
                   backend reports the reset; a quiet period never heals it

An XID not in the table is RESET, as the device plugin and the DRA driver treat every XID they do
not know as fatal: a card that did not need the reset costs an admin one `nvidia-smi -r`, a card
that did need it would otherwise fail the next claim's job.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class XidKind(enum.Enum):
    """What an XID means for the card (see the module docstring)."""

    INFORMATIONAL = "informational"
    APPLICATION = "application"
    TRANSIENT = "transient"
    RESET = "reset"


@dataclass(frozen=True, kw_only=True)
class XidInfo:
    """One XID code as NVIDIA documents it."""

    code: int
    """The XID number."""
    name: str
    """NVIDIA's short description."""
    kind: XidKind
    """What it means for the card."""
    action: str = ""
    """What a person does about it (for RESET: how to reset), for the card's condition message."""


_RESET_GPU = "reset the card (`nvidia-smi -r -i <index>` once no process uses it) or reboot the node"
_REBOOT = "reboot the node (a card that fell off the bus comes back only with the node)"

_TABLE: tuple[XidInfo, ...] = (
    # Application errors: the device plugin's default skip list (catalog: RESTART_APP / IGNORE).
    XidInfo(code=13, name="Graphics Engine Exception", kind=XidKind.APPLICATION),
    XidInfo(code=31, name="GPU memory page fault", kind=XidKind.APPLICATION),
    XidInfo(code=43, name="GPU stopped processing (one channel reset)", kind=XidKind.APPLICATION),
    XidInfo(code=45, name="Preemptive cleanup, due to previous errors", kind=XidKind.APPLICATION),
    XidInfo(code=68, name="Video processor (NVDEC) exception", kind=XidKind.APPLICATION),
    XidInfo(code=109, name="Context switch timeout", kind=XidKind.APPLICATION),
    # Informational (catalog: IGNORE): the row remap takes effect at the next reset, which NVML reports as
    # pending; the card serves work meanwhile (error containment and dynamic page blacklisting).
    XidInfo(code=63, name="ECC page retirement or row remapping recorded", kind=XidKind.INFORMATIONAL),
    XidInfo(code=92, name="High single-bit ECC error rate (corrected)", kind=XidKind.INFORMATIONAL),
    # Transient (catalog: RESTART_APP): the driver stopped only the affected program and retired the memory;
    # no new work for the quiet period, in case the memory keeps failing, then back.
    XidInfo(code=94, name="Contained ECC error", kind=XidKind.TRANSIENT),
    # Reset required (catalog: RESET_GPU, RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR).
    XidInfo(code=48, name="Double-bit ECC error", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=61, name="Internal micro-controller breakpoint/warning", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=62, name="Internal micro-controller halt", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=64, name="ECC page retirement or row remapping failed", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=74, name="NVLink error", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=79, name="GPU has fallen off the bus", kind=XidKind.RESET, action=_REBOOT),
    XidInfo(code=95, name="Uncontained ECC error", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=119, name="GSP RPC timeout", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=120, name="GSP error", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=140, name="Unrecovered ECC error", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=143, name="GPU initialization failure", kind=XidKind.RESET, action=_RESET_GPU),
    XidInfo(code=154, name="GPU recovery action changed (reset or reboot required)", kind=XidKind.RESET,
            action=_RESET_GPU),
)

XIDS: dict[int, XidInfo] = {info.code: info for info in _TABLE}
"""Every XID elasticgpu knows, by code."""


def classify(code: int) -> XidInfo:
    """What XID `code` means; an XID not in the table needs a reset (see the module docstring)."""
    known = XIDS.get(code)
    if known is not None:
        return known
    return XidInfo(code=code, name="not in elasticgpu's XID table", kind=XidKind.RESET, action=_RESET_GPU)


def codes(kind: XidKind) -> frozenset[int]:
    """The known XIDs of one kind."""
    return frozenset(info.code for info in _TABLE if info.kind is kind)
