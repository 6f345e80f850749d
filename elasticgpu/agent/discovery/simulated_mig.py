"""The simulated backend's MIG: profiles, placements and instances, with NVML's errors.

A simulated card in MIG mode (`mig: true` in the description) has the profiles of its model
(`elasticgpu.allocator.mig.profiles`: NVIDIA's placement tables) and starts with the instances
the description carves (`migInstances: [{profile: 3g.40gb, start: 4}]`, an admin's layout).
Creating and destroying follow NVML's rules and answers:

- the card not in MIG mode: `MigNotEnabled` (NVML_ERROR_NOT_SUPPORTED);
- a profile the model lacks, or a start the profile does not allow: `MigInvalidPlacement`
  (NVML_ERROR_INVALID_ARGUMENT);
- memory slices taken, or not enough compute slices left: `MigInsufficientResources`
  (NVML_ERROR_INSUFFICIENT_RESOURCES);
- destroying an instance a process runs on (a process entry with `instance: <id>`): `MigInUse`
  (NVML_ERROR_IN_USE); an id the card does not have: `MigNotFound` (NVML_ERROR_NOT_FOUND).

Each instance gets a stable `MIG-` uuid and stand-in access devices
(`<device_dir>/nvidia-caps/nvidia-cap<N>`, as the driver's caps files), so a CDI spec that names
them is valid for a real container runtime.

Instances outlive the agent as they do on a real card: they are kept in
`<device_dir>/mig-instances.json` (written atomically on every change) and read back when a
backend opens the same device folder, so a test can kill -9 the agent and find them again.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import models
from elasticgpu.agent.discovery.mig import NVML_PROFILE_IDS, MigInstanceInfo, MigProfileInfo
from elasticgpu.allocator.mig import profiles as mig_profiles
from elasticgpu.allocator.mig import slots as mig_slots

_MIG_NAMESPACE = uuidlib.UUID("0b6f5b7e-9d0c-4f3e-8a55-6c1d2e3f4a5b")  # fixed: simulated MIG uuids stay stable
_CAPS_PER_CARD = 256  # room for every instance id's two caps files on one card


def simulated_mig_uuid(card_uuid: str, gpu_instance_id: int, profile: str, start: int) -> str:
    """The uuid of a simulated instance: stable for the same card, id, profile and start."""
    return "MIG-" + str(uuidlib.uuid5(_MIG_NAMESPACE, f"{card_uuid}/{gpu_instance_id}/{profile}@{start}"))


class SimulatedMig:
    """MIG instances of the simulated cards. Not locked: the backend calls it under its lock."""

    def __init__(self, *, device_dir: Path, in_use: Callable[[str, int], bool],
                 make_device: Callable[[Path], None]) -> None:
        self._device_dir = device_dir
        self._in_use = in_use
        self._make_device = make_device
        self._cards: dict[str, models.Card] = {}
        self._instances: dict[str, dict[int, MigInstanceInfo]] = {}
        self._state = device_dir / "mig-instances.json"
        self._saved: dict[str, list[dict[str, object]]] = {}
        if self._state.exists():
            self._saved = json.loads(self._state.read_text())

    def _save(self) -> None:
        # Atomic: a kill -9 mid-write leaves the previous state, as a card keeps its instances.
        state = {card: [asdict(i) for i in sorted(held.values(), key=lambda i: i.gpu_instance_id)]
                 for card, held in self._instances.items()}
        temporary = self._state.with_name(f".{self._state.name}.tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self._state)

    def add_card(self, card: models.Card, carved: list[tuple[str, int]], *, where: str) -> None:
        """Track a card; `carved` are its instances at start (profile, start), checked like creations.
        A card in MIG mode whose model has no MIG tables raises `SimulationInvalid`."""
        self._cards[card.uuid] = card
        self._instances[card.uuid] = {}
        if card.mig_enabled and self._model(card) is None:
            raise errors.SimulationInvalid(f"{where}.mig: {card.model} has no MIG profiles; MIG needs a model such as"
                                           " NVIDIA A100-SXM4-80GB, H100 or H200")
        if carved and not card.mig_enabled:
            raise errors.SimulationInvalid(f"{where}.migInstances: needs mig: true (the card is not in MIG mode)")
        saved = self._saved.get(card.uuid)
        if saved is not None and card.mig_enabled:
            # The card kept its instances while no backend had it open (an agent restart).
            for entry in saved:
                instance = MigInstanceInfo(**{**entry, "device_paths": tuple(entry["device_paths"])})  # type: ignore[arg-type]
                self._instances[card.uuid][instance.gpu_instance_id] = instance
            return
        for profile, start in carved:
            try:
                self.create(card.uuid, profile=profile, start=start)
            except errors.MigError as e:
                raise errors.SimulationInvalid(f"{where}.migInstances: {e}") from None

    @staticmethod
    def _model(card: models.Card) -> mig_profiles.MigModel | None:
        return mig_profiles.model_for(card.model, card.memory_mib)

    def _mig_card(self, card_uuid: str) -> tuple[models.Card, mig_profiles.MigModel]:
        card = self._cards.get(card_uuid)
        if card is None:
            raise errors.MigNotFound(f"card {card_uuid} is not on this node")
        model = self._model(card)
        if not card.mig_enabled or model is None:
            raise errors.MigNotEnabled(f"card {card_uuid} ({card.model}) is not in MIG mode; an admin enables it"
                                       " (nvidia-smi -i <index> -mig 1, then a reset)")
        return card, model

    def profiles(self, card_uuid: str) -> list[MigProfileInfo]:
        """The card's profiles and starts (`MigNotEnabled` when not in MIG mode)."""
        card, model = self._mig_card(card_uuid)
        return [
            MigProfileInfo(name=p.name, profile_id=pid, compute_slices=p.compute, memory_slices=p.size,
                           memory_mib=p.memory_on(card.memory_mib), starts=p.starts)
            for p, pid in zip(model.profiles, NVML_PROFILE_IDS, strict=True)
        ]

    def instances(self, card_uuid: str) -> list[MigInstanceInfo]:
        """The card's instances, by id."""
        self._mig_card(card_uuid)
        return [self._instances[card_uuid][i] for i in sorted(self._instances[card_uuid])]

    def create(self, card_uuid: str, *, profile: str, start: int) -> MigInstanceInfo:
        """Create an instance, or raise the error NVML would."""
        card, model = self._mig_card(card_uuid)
        try:
            chosen = model.profile(profile)
        except KeyError as e:
            raise errors.MigInvalidPlacement(f"card {card_uuid}: {e.args[0]}") from None
        if start not in chosen.starts:
            raise errors.MigInvalidPlacement(
                f"card {card_uuid}: {profile} may start only at memory slice {', '.join(map(str, chosen.starts))},"
                f" not {start}")
        held = self._instances[card_uuid]
        used = mig_slots.EMPTY
        for instance in held.values():
            used = mig_slots.taking(used, model.profile(instance.profile), instance.start)
        reason = mig_slots.why_not(model, used, chosen, start)
        if reason:
            raise errors.MigInsufficientResources(f"card {card_uuid}: cannot create {profile} at slice {start}:"
                                                  f" {reason}")
        gpu_instance_id = next(i for i in range(1, len(held) + 2) if i not in held)
        base = card.minor * _CAPS_PER_CARD + 2 * gpu_instance_id
        paths = tuple(str(self._device_dir / "nvidia-caps" / f"nvidia-cap{base + k}") for k in (1, 2))
        for path in paths:
            self._make_device(Path(path))
        instance = MigInstanceInfo(
            card_uuid=card_uuid, gpu_instance_id=gpu_instance_id, profile=profile, start=start, size=chosen.size,
            uuid=simulated_mig_uuid(card_uuid, gpu_instance_id, profile, start), device_paths=paths,
        )
        held[gpu_instance_id] = instance
        self._save()
        return instance

    def destroy(self, card_uuid: str, gpu_instance_id: int) -> None:
        """Destroy an instance, or raise the error NVML would."""
        self._mig_card(card_uuid)
        held = self._instances[card_uuid]
        if gpu_instance_id not in held:
            raise errors.MigNotFound(f"card {card_uuid} has no GPU instance {gpu_instance_id}")
        if self._in_use(card_uuid, gpu_instance_id):
            raise errors.MigInUse(f"card {card_uuid}: GPU instance {gpu_instance_id} ({held[gpu_instance_id].profile})"
                                  " has processes running; stop them first")
        del held[gpu_instance_id]
        self._save()
