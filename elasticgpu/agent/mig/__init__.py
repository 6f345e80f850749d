"""The agent's MIG room: creating and destroying the MIG instances of claims (issue 26).

`instances.MigInstances` keeps the card's instances and the ledger's `mig_instances` rows in
step, two-phase like the CRI hook's injections; `cdi` names an instance as a CDI device.
"""

from elasticgpu.agent.mig.cdi import mig_device
from elasticgpu.agent.mig.instances import MigInstances

__all__ = ["MigInstances", "mig_device"]
