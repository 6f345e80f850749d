"""Kubernetes meta types used inside the kinds: object metadata, references, selectors, conditions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from elasticgpu.api.schema import KubeModel


class ObjectMeta(KubeModel):
    """The parts of `metadata` elasticgpu reads. The CRD leaves metadata to the API server."""

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[dict[str, Any]] = Field(default_factory=list)
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None


class ObjectReference(KubeModel):
    """A reference to another object, as in core/v1 ObjectReference."""

    api_version: str | None = Field(default=None, description="API version of the referent.")
    kind: str | None = Field(default=None, description="Kind of the referent.")
    namespace: str | None = Field(default=None, description="Namespace of the referent.")
    name: str | None = Field(default=None, description="Name of the referent.")
    uid: str | None = Field(default=None, description="UID of the referent; tells a recreated claim from the old one.")
    resource_version: str | None = Field(default=None, description="Resource version of the referent when referenced.")


class Condition(KubeModel):
    """A condition of an object, as in metav1.Condition."""

    type: str = Field(description="Type of the condition, e.g. Bound or Pending.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="One CamelCase word a program can match, e.g. NoCapacity.")
    message: str = Field(default="", description="What happened and what to do, for people.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="metadata.generation this condition was set for.")


class LabelSelectorRequirement(KubeModel):
    """One expression of a label selector."""

    key: str = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(default_factory=list, description="Values for In and NotIn; empty otherwise.")


class LabelSelector(KubeModel):
    """A label selector over ElasticGPUs, as in metav1.LabelSelector."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels that must all be equal.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Expressions that must all hold."
    )


class NodeSelectorRequirement(KubeModel):
    """One expression over node labels or fields."""

    key: str = Field(description="Label key (or field name in matchFields).")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[str] = Field(default_factory=list, description="Values for the operator.")


class NodeSelectorTerm(KubeModel):
    """Requirements that must all hold for a node to match."""

    match_expressions: list[NodeSelectorRequirement] = Field(
        default_factory=list, description="Requirements over node labels."
    )
    match_fields: list[NodeSelectorRequirement] = Field(
        default_factory=list, description="Requirements over node fields (metadata.name)."
    )


class NodeSelector(KubeModel):
    """Nodes matching any of the terms, as in core/v1 NodeSelector."""

    node_selector_terms: list[NodeSelectorTerm] = Field(description="Terms ORed together.")


class GPUNodeAffinity(KubeModel):
    """Which nodes can reach an ElasticGPU, as in a PersistentVolume's nodeAffinity."""

    required: NodeSelector | None = Field(default=None, description="Nodes the ElasticGPU can be used from.")
