"""Kubernetes meta types used inside the kinds: object metadata, references, selectors, conditions."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from elasticgpu.api import validation
from elasticgpu.api.schema import KubeModel, crd_field


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

    # The length bounds (Kubernetes' own limits, loose for uid and resourceVersion) bound the CEL
    # cost of the rule that keeps an ElasticGPU's claimRef once set.
    api_version: str | None = Field(
        default=None, description="API version of the referent.", json_schema_extra=crd_field(maxLength=317)
    )
    kind: str | None = Field(
        default=None, description="Kind of the referent.", json_schema_extra=crd_field(maxLength=63)
    )
    namespace: str | None = Field(
        default=None, description="Namespace of the referent.", json_schema_extra=crd_field(maxLength=63)
    )
    name: str | None = Field(
        default=None, description="Name of the referent.", json_schema_extra=crd_field(maxLength=253)
    )
    uid: str | None = Field(
        default=None,
        description="UID of the referent; tells a recreated claim from the old one.",
        json_schema_extra=crd_field(maxLength=128),
    )
    resource_version: str | None = Field(
        default=None,
        description="Resource version of the referent when referenced.",
        json_schema_extra=crd_field(maxLength=128),
    )


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

    crd_rules: ClassVar[list[dict[str, str]]] = validation.selector_value_rules(numeric=False)

    key: str = Field(description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] = Field(default_factory=list, description="Values for In and NotIn; empty otherwise.")

    def check(self, *, field: str) -> None:
        """Raise `InvalidSpec` when the values do not suit the operator; `field` is this expression's path."""
        validation.check_selector_values(self.operator, self.values, field=field)


class LabelSelector(KubeModel):
    """A label selector over ElasticGPUs, as in metav1.LabelSelector."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels that must all be equal.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Expressions that must all hold."
    )

    def check(self, *, field: str) -> None:
        """Raise `InvalidSpec` for the first malformed expression; `field` is the selector's path."""
        for index, expression in enumerate(self.match_expressions):
            expression.check(field=f"{field}.matchExpressions[{index}]")


class NodeSelectorRequirement(KubeModel):
    """One expression over node labels or fields."""

    crd_rules: ClassVar[list[dict[str, str]]] = validation.selector_value_rules(numeric=True)

    key: str = Field(description="Label key (or field name in matchFields).")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[str] = Field(default_factory=list, description="Values for the operator.")

    def check(self, *, field: str) -> None:
        """Raise `InvalidSpec` when the values do not suit the operator; `field` is this expression's path."""
        validation.check_selector_values(self.operator, self.values, field=field)


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

    def check(self, *, field: str) -> None:
        """Raise `InvalidSpec` for the first malformed requirement; `field` is the selector's path."""
        for t_index, term in enumerate(self.node_selector_terms):
            for key, requirements in (("matchExpressions", term.match_expressions), ("matchFields", term.match_fields)):
                for index, requirement in enumerate(requirements):
                    requirement.check(field=f"{field}.nodeSelectorTerms[{t_index}].{key}[{index}]")


class GPUNodeAffinity(KubeModel):
    """Which nodes can reach an ElasticGPU, as in a PersistentVolume's nodeAffinity."""

    required: NodeSelector | None = Field(default=None, description="Nodes the ElasticGPU can be used from.")
