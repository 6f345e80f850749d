"""Models of the four kinds, quantities and names: the one source of truth of elasticgpu.

Nothing here talks to Kubernetes, gRPC or a database; the controller and the agent translate
API objects to and from these models at their edges.
"""

from elasticgpu.api import names
from elasticgpu.api.claim import (
    ClaimUsage,
    ClaimUser,
    ElasticGPUClaim,
    ElasticGPUClaimSpec,
    ElasticGPUClaimStatus,
    ResourceRequirements,
)
from elasticgpu.api.elastic_gpu import (
    ElasticGPU,
    ElasticGPUSpec,
    ElasticGPUStatus,
    GPUShareSource,
    PhysicalGPUSource,
)
from elasticgpu.api.errors import (
    ElasticGPUError,
    InvalidClassParameters,
    InvalidQuantity,
    InvalidRequest,
    InvalidSpec,
    NotFound,
)
from elasticgpu.api.gpu import GPU, GPUAllocation, GPUPreparedClaim, GPURunningClaim, GPUSpec, GPUStatus, GPUUsage
from elasticgpu.api.gpu_class import ClassParameters, ElasticGPUClass, parse_class_parameters
from elasticgpu.api.kinds import KINDS, KindInfo
from elasticgpu.api.meta import (
    Condition,
    GPUNodeAffinity,
    LabelSelector,
    LabelSelectorRequirement,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ObjectMeta,
    ObjectReference,
)
from elasticgpu.api.printing import allocatable_summary, claim_key, gpu_capacity, gpu_list
from elasticgpu.api.quantities import format_memory, parse_count, parse_memory_mib
from elasticgpu.api.quota import ElasticGPUQuota, ElasticGPUQuotaSpec, ElasticGPUQuotaStatus, QuotaCharge
from elasticgpu.api.resources import GpuRequest, parse_claim_resources, parse_resource_map

__all__ = [
    "GPU",
    "KINDS",
    "ClaimUsage",
    "ClaimUser",
    "ClassParameters",
    "Condition",
    "ElasticGPU",
    "ElasticGPUClaim",
    "ElasticGPUClaimSpec",
    "ElasticGPUClaimStatus",
    "ElasticGPUClass",
    "ElasticGPUError",
    "ElasticGPUQuota",
    "ElasticGPUQuotaSpec",
    "ElasticGPUQuotaStatus",
    "ElasticGPUSpec",
    "ElasticGPUStatus",
    "GPUAllocation",
    "GPUNodeAffinity",
    "GPUPreparedClaim",
    "GPURunningClaim",
    "GPUShareSource",
    "GPUSpec",
    "GPUStatus",
    "GPUUsage",
    "GpuRequest",
    "InvalidClassParameters",
    "InvalidQuantity",
    "InvalidRequest",
    "InvalidSpec",
    "KindInfo",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "NotFound",
    "ObjectMeta",
    "ObjectReference",
    "PhysicalGPUSource",
    "QuotaCharge",
    "ResourceRequirements",
    "allocatable_summary",
    "claim_key",
    "format_memory",
    "gpu_capacity",
    "gpu_list",
    "names",
    "parse_claim_resources",
    "parse_class_parameters",
    "parse_count",
    "parse_memory_mib",
    "parse_resource_map",
]
