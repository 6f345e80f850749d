"""The agent's MIG room: creating and destroying the MIG instances of claims (issue 26).

`instances.MigInstances` keeps the card's instances and the ledger's `mig_instances` rows in
step, two-phase like the CRI hook's injections; `cdi` names an instance as a CDI device;
`hooks.MigHooks` wraps the CRI claim hooks to give MIG claims' containers their instance.
"""

from elasticgpu.agent.mig.cdi import mig_device
from elasticgpu.agent.mig.hooks import MigHooks
from elasticgpu.agent.mig.instances import MigInstances
from elasticgpu.agent.mig.room import MigRoom
from elasticgpu.agent.mig.unsupported import MigUnsupported

__all__ = ["MigHooks", "MigInstances", "MigRoom", "MigUnsupported", "mig_device"]
