"""A simulated GPU node for the CRI tests: the agent's view as plain objects, stand-in devices, CDI spec."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting import cdi
from elasticgpu.agent.injecting.injection import CardInfo, ClaimInfo, ClaimUser, PodRef

NODE = "node-a"
NVIDIA_MAJOR = 195
CARDS = [
    CardInfo(uuid="GPU-11111111-2222-3333-4444-555555555500", index=0, memory_mib=81920),
    CardInfo(uuid="GPU-11111111-2222-3333-4444-555555555501", index=1, memory_mib=81920),
]


@dataclass
class View:
    """injection.AgentView filled with plain objects, as the agent fills it from the API server."""

    node_name: str = NODE
    reason: str | None = None
    claims: dict[tuple[str, str], ClaimInfo] = field(default_factory=dict)
    cards: dict[str, CardInfo] = field(default_factory=lambda: {c.uuid.lower(): c for c in CARDS})
    gpu_access: dict[str, bool | None] = field(default_factory=dict)  # namespace -> label (absent: False)
    warnings: list[tuple[PodRef, str, str]] = field(default_factory=list)
    inventory_known: bool = True  # False: discovery has not run yet (has_cards is None)

    def not_ready_reason(self) -> str | None:
        return self.reason

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.claims.get((namespace, name))

    def card(self, uuid: str) -> CardInfo | None:
        return self.cards.get(uuid.lower())

    def has_cards(self) -> bool | None:
        return bool(self.cards) if self.inventory_known else None

    def node_gpu_access(self, namespace: str) -> bool | None:
        return self.gpu_access.get(namespace, False)

    def warn(self, pod: PodRef, reason: str, message: str) -> None:
        self.warnings.append((pod, reason, message))

    def add(self, claim: ClaimInfo) -> ClaimInfo:
        self.claims[(claim.namespace, claim.name)] = claim
        return claim

    def to_json(self) -> str:
        return json.dumps(
            {
                "node_name": self.node_name,
                "reason": self.reason,
                "claims": [
                    vars(c) | {"gpus": list(c.gpus), "users": [vars(u) for u in c.users]} for c in self.claims.values()
                ],
                "cards": [vars(c) for c in self.cards.values()],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> View:
        data: dict[str, Any] = json.loads(text)
        view = cls(node_name=data["node_name"], reason=data["reason"])
        view.cards = {c["uuid"].lower(): CardInfo(**c) for c in data["cards"]}
        for c in data["claims"]:
            view.add(ClaimInfo(**(c | {"gpus": tuple(c["gpus"]), "users": tuple(ClaimUser(**u) for u in c["users"])})))
        return view


def slice_claim(namespace: str, name: str, *, user: str = "", **changes: Any) -> ClaimInfo:
    """A Bound claim of 30% and 10 GiB of the first card on this node, serving pod `user`."""
    claim = ClaimInfo(
        namespace=namespace,
        name=name,
        phase="Bound",
        node_name=NODE,
        elastic_gpu=f"egpu-{name}",
        gpus=(CARDS[0].uuid,),
        cores=30,
        memory_mib=10240,
        users=(ClaimUser(user),) if user else (),
    )
    return replace(claim, **changes)


def whole_claim(namespace: str, name: str, *, user: str = "") -> ClaimInfo:
    """A Bound claim of the whole second card, serving pod `user`."""
    return slice_claim(namespace, name, user=user, gpus=(CARDS[1].uuid,), cores=100, memory_mib=0)


def serving(claim: ClaimInfo, pod_name: str) -> ClaimInfo:
    """The claim after the controller moved status.users to another pod."""
    return replace(claim, users=(ClaimUser(pod_name),))


def stand_ins(dev_dir: Path) -> tuple[list[cdi.CardDevice], list[cdi.DeviceNode]]:
    """Character devices standing in for the cards (/dev/nvidia<index>) and the control nodes,
    made with mknod under `dev_dir` as the simulated backend makes them; as CDI inputs."""
    dev_dir.mkdir(parents=True, exist_ok=True)

    def node(name: str, minor: int) -> str:
        path = dev_dir / name
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        return str(path)

    cards = [cdi.CardDevice(uuid=c.uuid, minor=c.index, host_path=node(f"nvidia{c.index}", c.index)) for c in CARDS]
    control = [
        cdi.DeviceNode(path="/dev/nvidiactl", host_path=node("nvidiactl", 255)),
        cdi.DeviceNode(path="/dev/nvidia-uvm", host_path=node("nvidia-uvm", 250)),
        cdi.DeviceNode(path="/dev/nvidia-uvm-tools", host_path=node("nvidia-uvm-tools", 251)),
    ]
    return cards, control


def publish_cards(cdi_dir: Path, dev_dir: Path) -> None:
    """Make the stand-in devices and write the CDI spec of both cards."""
    cards, control = stand_ins(dev_dir)
    cdi.write_spec(cdi_dir, cards, control)
