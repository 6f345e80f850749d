"""Isolation modes of a slice's container: None (advisory), MPS, HAMiCore, each a room of its own
behind one seam (`base.Room`); the CRI hook asks `IsolationRooms` and never branches on a mode."""

from elasticgpu.agent.isolation import mps_ceiling, mps_daemons, mps_finding
from elasticgpu.agent.isolation.base import (
    ANNOTATION_CARDS,
    ANNOTATION_MODE,
    ANNOTATION_MPS_USER,
    MODE_HAMI_CORE,
    MODE_MPS,
    MODE_NONE,
    Contribution,
    Mount,
    Room,
    RunningContainer,
    Slice,
    Unavailable,
)
from elasticgpu.agent.isolation.hami_core import HamiCoreRoom
from elasticgpu.agent.isolation.mps import Daemons, MpsRoom
from elasticgpu.agent.isolation.mps_client import MpsDaemonsClient, MpsServiceUnreachable
from elasticgpu.agent.isolation.mps_daemons import DaemonSettings, MpsDaemons
from elasticgpu.agent.isolation.mps_service import MpsDaemonService
from elasticgpu.agent.isolation.none import NoneRoom
from elasticgpu.agent.isolation.rooms import IsolationRooms

__all__ = [
    "ANNOTATION_CARDS",
    "ANNOTATION_MODE",
    "ANNOTATION_MPS_USER",
    "MODE_HAMI_CORE",
    "MODE_MPS",
    "MODE_NONE",
    "Contribution",
    "DaemonSettings",
    "Daemons",
    "HamiCoreRoom",
    "IsolationRooms",
    "Mount",
    "MpsDaemonService",
    "MpsDaemons",
    "MpsDaemonsClient",
    "MpsRoom",
    "MpsServiceUnreachable",
    "NoneRoom",
    "Room",
    "RunningContainer",
    "Slice",
    "Unavailable",
    "mps_ceiling",
    "mps_daemons",
    "mps_finding",
]
