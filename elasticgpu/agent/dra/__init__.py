"""The agent as the DRA driver `gpu.elasticgpu.io` for the cards a platform team hands to DRA (docs/dra.md).

    card_owners.py       who owns a card: spec.owner / status.owner of its GPU object, read defensively
    slice_content.py     pure: the node's GPU objects -> the ResourceSlice (names: elasticgpu/api/dra_names.py)
    slice_publishing.py  SlicePublisher: keeps the node's ResourceSlice true (list + watch of its GPUs)
    protocol.py          the kubelet plugin protos (registration v1, DRA v1 and v1beta1), compiled at import
    preparing.py         Preparer: NodePrepareResources / NodeUnprepareResources as plain calls
    checkpoint.py        Checkpoint: which claims this node prepared (two-phase, checksummed file)
    class_config.py      a claim's isolation mode and over-limit policy: its DeviceClass's opaque config, not its own
    claim_cdi.py         the CDI spec of one prepared claim (its env: visible devices, a slice's limits)
    plugin_serving.py    KubeletPlugin: the two gRPC servers on kubelet's unix sockets

The agent (running.py) wires them: `Preparer(node=..., read_claim=kube.read_resource_claim, list_gpus=...,
store=Checkpoint(path), cdi_dir=...)`, `KubeletPlugin(preparer, kubelet_dir=...).start()` and a thread
running `SlicePublisher(kube).run(stop)`; the node hook asks `Checkpoint.claims_of_pod` which containers
kubelet prepared through DRA (they keep kubelet's devices, get their class's isolation and a ledger row).
"""

from elasticgpu.agent.dra.checkpoint import Checkpoint
from elasticgpu.agent.dra.plugin_serving import KubeletPlugin
from elasticgpu.agent.dra.preparing import Preparer
from elasticgpu.agent.dra.slice_publishing import SlicePublisher
from elasticgpu.api.dra_names import DRIVER_NAME as DRIVER

__all__ = [
    "DRIVER",
    "Checkpoint",
    "KubeletPlugin",
    "Preparer",
    "SlicePublisher",
]
