"""The agent's own exceptions; third-party errors (NVML, SQLAlchemy, Alembic, grpc) become these at the edge.

::

    AgentError                      anything the agent reports to its operator (at start-up: and stops on)
    ├── DiscoveryError              the cards could not be discovered
    │   ├── NvmlUnavailable         NVML (libnvidia-ml.so.1) cannot be loaded or initialised
    │   ├── SimulationInvalid       the simulated backend's YAML file is wrong (names file, field, fix)
    │   └── MigError                a MIG instance call failed (NVML's errors, the simulated ones alike)
    │       ├── MigNotEnabled       the card is not in MIG mode (NVML_ERROR_NOT_SUPPORTED): the admin's choice
    │       ├── MigInvalidPlacement the profile or start is not one the card allows (NVML_ERROR_INVALID_ARGUMENT)
    │       ├── MigInsufficientResources  the slices are taken (NVML_ERROR_INSUFFICIENT_RESOURCES)
    │       ├── MigInUse            a process runs on the instance (NVML_ERROR_IN_USE)
    │       └── MigNotFound         no such instance (NVML_ERROR_NOT_FOUND)
    ├── LedgerError                 the ledger database cannot be used
    │   ├── LedgerNewerThanCode     the database was migrated by a newer agent
    │   ├── LedgerStateError        a ledger call does not fit the row's state (a caller's bug)
    │   └── LedgerRebuildWaits      a lost ledger's rebuild waits until its containers' claims can be read
    ├── KubeError                   an API call failed (the loops retry it with backoff)
    │   ├── KubeNotFound            404: the object does not exist (any more)
    │   ├── KubeConflict            409: the resourceVersion precondition failed; re-read and retry
    │   └── KubeUnavailable         anything else: connection refused, timeout, 5xx, 403
    └── RuntimeCallFailed           a call of the agent's own to the container runtime (CRI) failed
        └── ContainerNotFound       the runtime does not know the container (removed meanwhile)

Every message names the object, the field and the fix, because the operator reads it in a
DaemonSet's log, far from the code.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error the agent reports instead of a stack trace."""


class DiscoveryError(AgentError):
    """The node's cards could not be discovered."""


class NvmlUnavailable(DiscoveryError):
    """NVML cannot be loaded or initialised on this node."""


class SimulationInvalid(DiscoveryError):
    """The simulated backend's description (YAML file or injected event) is invalid."""


class MigError(DiscoveryError):
    """A MIG instance could not be listed, created or destroyed."""


class MigNotEnabled(MigError):
    """The card is not in MIG mode; enabling it is the admin's choice (it needs a reset)."""


class MigInvalidPlacement(MigError):
    """The card's model has no such profile, or the profile may not start there."""


class MigInsufficientResources(MigError):
    """The instance's memory or compute slices are taken by other instances."""


class MigInUse(MigError):
    """A process still runs on the instance, so it cannot be destroyed."""


class MigNotFound(MigError):
    """The card has no instance of that id."""


class LedgerError(AgentError):
    """The ledger database cannot be opened, migrated or written."""


class LedgerNewerThanCode(LedgerError):
    """The ledger database is at a revision this agent does not know: a newer agent migrated it."""


class LedgerStateError(LedgerError):
    """A ledger call that does not fit the state of the row it names."""


class LedgerRebuildWaits(LedgerError):
    """A lost ledger is rebuilt from its containers' claims as the controller bound them: not before they can be
    read (the start-up reconciliation is retried; claims wait meanwhile)."""


class KubeError(AgentError):
    """An API call of the agent failed."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status
        """HTTP status of the answer; 0 when there was none (connection refused, timeout)."""


class KubeNotFound(KubeError):
    """The object does not exist."""


class KubeConflict(KubeError):
    """The write's resourceVersion precondition failed: someone else changed the object."""


class KubeUnavailable(KubeError):
    """The API server did not answer, or answered with an error that is not ours to fix here."""


class RuntimeCallFailed(AgentError):
    """A call the agent itself made to the container runtime (not one of kubelet's it forwards) failed."""

    def __init__(self, message: str, *, code: str = "") -> None:
        super().__init__(message)
        self.code = code
        """The gRPC status code's name (UNAVAILABLE, DEADLINE_EXCEEDED, ...); '' when there was none."""


class ContainerNotFound(RuntimeCallFailed):
    """The runtime does not know the container: it was removed meanwhile."""
