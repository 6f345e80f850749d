"""RDMA NICs for claims that ask for `elasticgpu.io/rdma` (issue 27): a room of its own.

The CRI hook asks the node's `RdmaRoom` (room.py) for the CDI device names of a claim's NICs
(the ElasticGPU's spec.physicalGPU.rdmaNics, chosen by the controller on the cards' PCIe roots)
and never branches on how the node provides them; devices.py builds the CDI spec (spec_file.py writes it) that turns the
names into device nodes (/dev/infiniband/uverbsN, rdma_cm).
"""

from elasticgpu.agent.rdma.devices import CDI_KIND, SPEC_FILE, NicDevices, build_spec, cdi_name, is_ours
from elasticgpu.agent.rdma.room import NO_RDMA, MissingNic, NodeNics, RdmaRoom

__all__ = [
    "CDI_KIND", "NO_RDMA", "SPEC_FILE", "MissingNic", "NicDevices", "NodeNics", "RdmaRoom", "build_spec", "cdi_name",
    "is_ours",
]
