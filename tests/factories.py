"""factory-boy factories for the four kinds, building `elasticgpu.api` models.

`GPUFactory()` is a T4 on `node-<n>`; override any field: `GPUFactory(spec__memory=81920)`.
`.to_dict()` on the result gives the manifest to send to the API server.
"""

from __future__ import annotations

import uuid

import factory

from elasticgpu.api import (
    GPU,
    ElasticGPU,
    ElasticGPUClaim,
    ElasticGPUClaimSpec,
    ElasticGPUClass,
    ElasticGPUSpec,
    GPUShareSource,
    GPUSpec,
    ObjectMeta,
    ResourceRequirements,
    names,
)


def _uuid(n: int) -> str:
    return f"GPU-{uuid.UUID(int=n + 1)}"


class GPUSpecFactory(factory.Factory):
    class Meta:
        model = GPUSpec

    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(_uuid)
    model = "NVIDIA T4"
    memory = 15360
    node_name = factory.Sequence(lambda n: f"node-{n // 8}")
    numa = 0


class GPUFactory(factory.Factory):
    class Meta:
        model = GPU

    spec = factory.SubFactory(GPUSpecFactory)
    metadata = factory.LazyAttribute(lambda o: ObjectMeta(name=names.gpu_object_name(o.spec.uuid)))


class ResourceRequirementsFactory(factory.Factory):
    class Meta:
        model = ResourceRequirements

    requests = factory.LazyFunction(lambda: {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "4Gi"})
    limits = factory.LazyFunction(dict)


class ClaimSpecFactory(factory.Factory):
    class Meta:
        model = ElasticGPUClaimSpec

    resources = factory.SubFactory(ResourceRequirementsFactory)
    elastic_gpu_class_name = None


class ClaimFactory(factory.Factory):
    class Meta:
        model = ElasticGPUClaim

    metadata = factory.Sequence(lambda n: ObjectMeta(name=f"claim-{n}"))
    spec = factory.SubFactory(ClaimSpecFactory)


class ElasticGPUSpecFactory(factory.Factory):
    class Meta:
        model = ElasticGPUSpec

    capacity = factory.LazyFunction(lambda: {names.RESOURCE_CORE: 25, names.RESOURCE_MEMORY: "4Gi"})
    gpu_share = factory.LazyFunction(lambda: GPUShareSource(gpu_name=names.gpu_object_name(_uuid(0))))
    reclaim_policy = "Retain"


class ElasticGPUFactory(factory.Factory):
    class Meta:
        model = ElasticGPU

    metadata = factory.Sequence(lambda n: ObjectMeta(name=f"static-egpu-{n}"))
    spec = factory.SubFactory(ElasticGPUSpecFactory)


class ClassFactory(factory.Factory):
    class Meta:
        model = ElasticGPUClass

    metadata = factory.Sequence(lambda n: ObjectMeta(name=f"class-{n}"))
    provisioner = names.PROVISIONER_GPUSHARE
    parameters = factory.LazyFunction(lambda: {"policy": "fragmentation"})
    reclaim_policy = "Delete"
    binding_mode = "Immediate"
