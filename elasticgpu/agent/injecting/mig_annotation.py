"""The container annotation that names a MIG claim's instance: what a ledger rebuild reads back.

The MIG hooks (agent/mig/hooks.py) give a MIG claim's container its instance and write, beside
`elasticgpu.io/claim`, the annotation

    elasticgpu.io/mig-instance: "uuid=MIG-...;profile=3g.40gb;start=4;card=GPU-...;gpuInstance=1;
                                 elasticGPU=egpu-...;cores=42;memory=40960"   (one line)

The runtime keeps a container's annotations as long as the container, so when the ledger is lost
(`gated.rebuild`) the instance a running container holds is recorded again (its `mig_instances`
row, and its ElasticGPU, card and size on the container's row) and is neither destroyed as
nobody's nor forgotten. Only the agent writes it: a user's annotation of that key is dropped
(`injection`). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

MIG_ANNOTATION = "elasticgpu.io/mig-instance"
_FIELDS = ("uuid", "profile", "start", "card", "gpuInstance", "elasticGPU", "cores", "memory")


@dataclass(frozen=True, kw_only=True)
class MigAnnotation:
    """A MIG claim's instance as its container's annotation carries it."""

    uuid: str
    """The instance's uuid (`MIG-...`), as NVIDIA_VISIBLE_DEVICES names it."""
    profile: str
    start: int
    card: str
    """The uuid of the card it is carved from (`GPU-...`)."""
    gpu_instance_id: int
    elastic_gpu: str
    """The ElasticGPU the instance is recorded for (the ledger's key of it)."""
    cores: int
    """Percent of the card the claim holds (the profile's)."""
    memory_mib: int

    def value(self) -> str:
        """The annotation's value."""
        values = (self.uuid, self.profile, self.start, self.card, self.gpu_instance_id, self.elastic_gpu,
                  self.cores, self.memory_mib)
        return ";".join(f"{key}={value}" for key, value in zip(_FIELDS, values, strict=True))


def parse(value: str) -> MigAnnotation | None:
    """The annotation's instance, or None when `value` is not one the agent wrote (a field missing
    or malformed): a rebuild then records the container as it would without MIG."""
    fields = dict(part.split("=", 1) for part in value.split(";") if "=" in part)
    if any(not fields.get(key) for key in _FIELDS):
        return None
    try:
        return MigAnnotation(uuid=fields["uuid"], profile=fields["profile"], start=int(fields["start"]),
                             card=fields["card"], gpu_instance_id=int(fields["gpuInstance"]),
                             elastic_gpu=fields["elasticGPU"], cores=int(fields["cores"]),
                             memory_mib=int(fields["memory"]))
    except ValueError:
        return None
