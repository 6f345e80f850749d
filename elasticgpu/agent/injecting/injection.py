"""What to do with one CreateContainer: pure decisions, no I/O (DESIGN.md, "Node agent").

Input: the container as kubelet asks for it (`ContainerRequest`: the pod from the sandbox's
`io.kubernetes.pod.*` labels and annotations, the container's env, CDI devices, annotations),
the agent's view of claims and cards (`AgentView`, filled by the agent from the API server),
and the pods that hold the claim now (from the ledger). Output: a `ContainerEdit` (the
container's final env, CDI devices and annotations) or `Refused`.

    container names no claim (no egpuc.elasticgpu.io/<c>, no elasticgpu.io/request.<c>)
        its namespace carries elasticgpu.io/node-gpu-access=true (the node's own GPU pods:
        dcgm-exporter, the GPU Operator's validators; only the platform team can set the label,
        deploy/policies/node-gpu-access.yaml)
                                           -> passed through untouched (only the claim annotation,
                                              which only we may set, is removed)
        privileged, the admin turned the refusal on (--refuse-privileged, off by default), on a
        node with cards, namespace neither labelled nor in the privileged allow-list
        (kube-system), pod not one of the privileged pods (a namespace and a label: the chart's
        agent installer)                   -> refused, FAILED_PRECONDITION, and a Warning Event on
                                              the pod: a privileged container sees every card
                                              (UNAVAILABLE while the label cannot be read)
        the same while the node's cards are not known yet (the agent starting, discovery not run)
                                           -> refused, UNAVAILABLE (kubelet retries): until the
                                              agent knows better, the node counts as one with cards
        privileged, by default             -> as any other below: a privileged container is root on
           its node and no hook confines it (Pod Security Admission decides who may run one); the
           node's own DaemonSets (CNI, CSI, the GPU Operator's) run privileged in many namespaces.
           Its GPU use is reported as unattributed processes (usage.py), never hidden.
        otherwise                          -> our CDI devices and claim annotation stripped,
           NVIDIA_VISIBLE_DEVICES=void (CUDA images set it to `all`; a setting, on by default).
           The claim part of the view is not consulted: such a container passes even while the
           agent is starting (a namespace label that cannot be read counts as absent).
    container names a claim
        view not ready                     -> refused, UNAVAILABLE (kubelet retries)
        claim missing / not Bound / bound to another node / of another namespace / serving
        another pod (status.users) / still held by another pod's container on this node (the
        ledger)                            -> refused, FAILED_PRECONDITION, saying what to fix
        privileged, and the claim's class does not say allowPrivileged (status.allowPrivileged,
        which only the controller writes)  -> refused, FAILED_PRECONDITION, and a Warning Event:
           privileged, the container gets every device of the node, other tenants' cards
           included, so no claim's size holds in it (issue 33.4)
        its cards unknown to the agent     -> refused, UNAVAILABLE (kubelet retries)
        otherwise                          -> CDI devices `elasticgpu.io/gpu=<uuid>` (CDI field,
           and the `cdi.k8s.io/` annotation if asked), NVIDIA_VISIBLE_DEVICES, the claim
           annotation, and for a slice what the room of its isolation mode contributes
           (elasticgpu/agent/isolation: None gives the MPS and HAMi-core limits as advice, MPS the
           card's pipe folder and per-client limits, HAMiCore the preloaded library and its limits).
           Env the spec set under these names is replaced, CDI devices of ours it named are dropped
           (only the claim's stay).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

import grpc

from elasticgpu.agent import isolation, rdma
from elasticgpu.agent.injecting.mig_annotation import MIG_ANNOTATION
from elasticgpu.agent.injecting.refused import Refused
from elasticgpu.api import names, pod_claims

CDI_KIND = "elasticgpu.io/gpu"
CDI_CLAIM_KIND = "elasticgpu.io/claim"  # a ResourceClaim the DRA driver prepared (agent/dra/claim_cdi.py)
"""Our CDI kind: device `elasticgpu.io/gpu=<card uuid>` of the spec cdi.py writes."""
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_ANNOTATION_KEY = f"{CDI_ANNOTATION_PREFIX}elasticgpu"
CLAIM_ANNOTATION = "elasticgpu.io/claim"
RESOURCE_CLAIM_ANNOTATION = "elasticgpu.io/resource-claim"
"""Set on a container of a ResourceClaim our DRA driver prepared: `<namespace>/<name>` (dra_containers.py)."""
_OURS_ANNOTATIONS = (CLAIM_ANNOTATION, RESOURCE_CLAIM_ANNOTATION, MIG_ANNOTATION, isolation.ANNOTATION_MODE,
                     isolation.ANNOTATION_CARDS, isolation.ANNOTATION_MPS_USER)
"""Annotations only the agent may put on a container (which claim, which MIG instance, what isolates it)."""
"""Set on a container that got a claim: `<namespace>/<name>` (usage accounting reads it back)."""

ENV_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_MPS_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_HAMI_MEMORY_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT"  # _<i>, and the bare name (all devices)
ENV_HAMI_SM = "CUDA_DEVICE_SM_LIMIT"  # and _<i>
ENV_MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_HAMI_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
VISIBLE_NONE = "void"  # the NVIDIA container toolkit's value for "no GPU"

NODE_GPU_ACCESS_LABEL = "elasticgpu.io/node-gpu-access"
"""A namespace labelled with it ("true") runs its containers without a claim as if the agent were not
there: the node's own GPU pods. Guarded by the ValidatingAdmissionPolicy deploy/policies/node-gpu-access.yaml."""
PRIVILEGED_REASON = "PrivilegedWithoutClaim"
PRIVILEGED_CLAIM_REASON = "PrivilegedWithClaim"
"""The Warning Event of a privileged container refused its claim (its class does not allow privileged use)."""
ALLOW_PRIVILEGED_FIELD = "allowPrivileged"
"""The class field (and the claim's status field the controller copies it into) that lets a claim serve
privileged containers."""

LABEL_POD_NAME = "io.kubernetes.pod.name"
LABEL_POD_NAMESPACE = "io.kubernetes.pod.namespace"
LABEL_POD_UID = "io.kubernetes.pod.uid"
LABEL_CONTAINER_NAME = "io.kubernetes.container.name"


class CdiForm(Enum):
    """How the CDI devices are requested from the runtime."""

    FIELD = "field"  # ContainerConfig.CDI_devices: containerd >= 1.7.2, CRI-O >= 1.28
    ANNOTATION = "annotation"  # cdi.k8s.io/<key>: older runtimes read only this
    BOTH = "both"


_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
PRIVILEGED_PODS_FORM = "<namespace>/<label>=<value>"


@dataclass(frozen=True)
class PrivilegedPods:
    """Pods whose privileged containers pass without a claim: those of `namespace` labelled `key`=`value`.

    The namespace is the boundary: only who may create pods there can run one. The label only
    narrows within it (whoever creates a pod writes its labels), so that one privileged pod of the
    namespace passing does not let every other through."""

    namespace: str
    key: str
    value: str

    def matches(self, pod: PodRef, labels: Mapping[str, str]) -> bool:
        """True for a pod of this namespace that carries this label."""
        return pod.namespace == self.namespace and labels.get(self.key) == self.value

    def __str__(self) -> str:
        return f"{self.namespace}/{self.key}={self.value}"


def parse_privileged_pods(text: str) -> tuple[PrivilegedPods, ...]:
    """The comma-separated `<namespace>/<label>=<value>` entries of `text`; raises ValueError naming the
    setting, the entry and the form."""
    found = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        namespace, _, selector = entry.partition("/")
        key, equals, value = selector.partition("=")
        if not (_NAMESPACE.match(namespace) and key.strip() and equals):
            raise ValueError(
                f"--privileged-pods / ELASTICGPU_AGENT_PRIVILEGED_PODS: entry {entry!r} is not "
                f"{PRIVILEGED_PODS_FORM} (a namespace name, a pod label and its value, e.g. "
                "elasticgpu-system/app.kubernetes.io/component=agent-installer); fix or remove it"
            )
        found.append(PrivilegedPods(namespace, key.strip(), value.strip()))
    return tuple(found)


@dataclass(frozen=True, kw_only=True)
class InjectionSettings:
    """Choices of the injection, per node."""

    cdi_form: CdiForm = CdiForm.FIELD
    """containerd 1.7 reads both forms and merges them; the field is the CRI's own."""
    neutralise_unclaimed: bool = True
    """A container without a claim gets NVIDIA_VISIBLE_DEVICES=void, so a CUDA image's `all`
    does not hand it every card through the NVIDIA runtime hook. Off only on a node where
    another device plugin hands out GPUs through that variable."""
    refuse_privileged: bool = False
    """Refuse a privileged container without a claim on a node with cards (an admin's opt-in). Off
    by default: a privileged container is root on its node, and refusing it here does not confine
    it (Pod Security Admission decides who may run one) but breaks the node's own DaemonSets (CNI,
    CSI, the GPU Operator's) in namespaces outside the allow-list. Its GPU use is reported."""
    privileged_namespaces: tuple[str, ...] = ("kube-system",)
    """Namespaces whose privileged containers pass without a claim or label (kube-proxy, CNI
    agents run privileged there; only cluster admins create pods there)."""
    privileged_pods: tuple[PrivilegedPods, ...] = ()
    """Pods whose privileged containers pass without a claim or label: a namespace and a pod label
    each (the chart's agent installer, re-created through this agent at every upgrade)."""


@dataclass(frozen=True)
class PodRef:
    """A pod, as named in messages."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ClaimUser:
    """The pod a claim serves, from the claim's `status.users` (written by the controller)."""

    name: str
    uid: str = ""  # empty: any pod of that name (as the controller's own check reads it)

    def is_pod(self, pod: PodRef) -> bool:
        """True when this entry names `pod` (of the claim's namespace)."""
        return self.name == pod.name and (not self.uid or self.uid == pod.uid)


@dataclass(frozen=True, kw_only=True)
class ClaimInfo:
    """What the agent knows of a claim (from the claim and its ElasticGPU)."""

    namespace: str
    name: str
    phase: str  # Pending, Bound, Lost
    node_name: str | None  # node of the bound card(s)
    elastic_gpu: str  # name of the ElasticGPU it is bound to ("" while unbound)
    gpus: tuple[str, ...]  # uuids of the bound card(s), in the order the container sees them
    cores: int  # percent of each card's compute (100: whole cards)
    memory_mib: int  # MiB of each card's memory reserved (0: the whole card's)
    users: tuple[ClaimUser, ...] = ()  # status.users: the pod the claim serves (at most one)
    partition: tuple[str, int] | None = None  # status.partition: its MIG instance (profile, start slice)
    isolation: str = "None"  # status.isolation: what enforces a slice's size (None, MPS, HAMiCore, WholeCard)
    nics: tuple[str, ...] = ()  # RDMA NICs of its ElasticGPU (spec.physicalGPU.rdmaNics), given through agent/rdma
    # status.allowPrivileged: the class lets privileged containers use the claim (copied by the controller on bind;
    # only it writes claim status). Such a container sees every card of the node, not only the claim's.
    allow_privileged: bool = False

    @property
    def whole_cards(self) -> bool:
        """True when the claim holds entire cards (no limits to set)."""
        return self.cores >= names.CORES_PER_CARD


@dataclass(frozen=True, kw_only=True)
class CardInfo:
    """A card of this node, as discovery found it."""

    uuid: str
    index: int
    memory_mib: int


class AgentView(Protocol):
    """The agent's picture of its node, filled from the API server (the agent's kube module)."""

    @property
    def node_name(self) -> str:
        """This node."""
        ...

    def not_ready_reason(self) -> str | None:
        """None once the view is complete (first list of claims and cards done), else why not."""
        ...

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        """The claim, or None if the API server has none of that name. May raise when the API
        server cannot be asked: the container is then refused as retryable."""
        ...

    def card(self, uuid: str) -> CardInfo | None:
        """A card of this node by uuid (any case), or None."""
        ...

    def has_cards(self) -> bool | None:
        """True when discovery reports at least one card on this node, False when it reports none,
        None while discovery has not run yet (the agent is starting: the cards are unknown)."""
        ...

    def node_gpu_access(self, namespace: str) -> bool | None:
        """True when the namespace carries NODE_GPU_ACCESS_LABEL=true, False when not, None when that
        cannot be told now (the API server does not answer). Must not block for long: it is asked for
        every container without a claim."""
        ...

    def warn(self, pod: PodRef, reason: str, message: str) -> None:
        """Record a Warning Event about the pod (best effort, off the caller's path)."""
        ...


@dataclass(frozen=True, kw_only=True)
class ContainerRequest:
    """The parts of a CreateContainerRequest the decision reads (plain values, not protobuf)."""

    pod: PodRef
    pod_annotations: Mapping[str, str]
    container: str
    envs: Sequence[tuple[str, str]]
    cdi_devices: Sequence[str]
    annotations: Mapping[str, str]
    privileged: bool = False  # linux.security_context.privileged
    run_as_user: int | None = None  # linux.security_context.run_as_user when the pod sets it (None: the image's user)
    pod_labels: Mapping[str, str] = field(default_factory=dict)  # the sandbox's labels: the pod's and kubelet's
    container_id: str | None = None  # known before the runtime creates it (NRI names it): the row is `created` at once


@dataclass(frozen=True, kw_only=True)
class ContainerEdit:
    """The container's final env, CDI devices and annotations, and the claim it uses (if any)."""

    envs: tuple[tuple[str, str], ...]
    cdi_devices: tuple[str, ...]
    annotations: dict[str, str]
    claim: ClaimInfo | None = None
    devices: tuple[str, ...] = field(default=())  # our CDI device names given to the container
    mounts: tuple[isolation.Mount, ...] = ()  # the isolation mode's mounts (a mount of the spec at the same path goes)


def cdi_device(uuid: str) -> str:
    """The CDI name of a card: `elasticgpu.io/gpu=<uuid>`."""
    return f"{CDI_KIND}={uuid}"


def is_ours(device: str) -> bool:
    """True for a CDI device name of our kinds (cards, DRA claims, and RDMA NICs: agent/rdma)."""
    return device.split("=", 1)[0] in (CDI_KIND, CDI_CLAIM_KIND) or rdma.is_ours(device)


def _our_env(key: str) -> bool:
    exact = (ENV_VISIBLE_DEVICES, ENV_MPS_THREADS, ENV_MPS_MEMORY, ENV_MPS_PIPE, ENV_HAMI_CACHE)
    return key in exact or key.startswith((ENV_HAMI_MEMORY_PREFIX, ENV_HAMI_SM))


def slice_of(claim: ClaimInfo, pod: PodRef, container: str, *, user: int | None = None) -> isolation.Slice | None:
    """The container of a slice claim as the isolation modes see it; None for whole cards (no mode applies)."""
    if claim.whole_cards:
        return None
    return isolation.Slice(claim=f"{claim.namespace}/{claim.name}", uuids=claim.gpus, cores=claim.cores,
                           memory_mib=claim.memory_mib, pod_uid=pod.uid, container=container, user=user)


def unavailable(request: ContainerRequest, claim: ClaimInfo, error: isolation.Unavailable) -> Refused:
    """The refusal of a container whose claim's isolation mode cannot serve it on this node."""
    subject = f"pod {request.pod}, container {request.container!r}: ElasticGPUClaim {claim.namespace}/{claim.name}"
    if error.retryable:
        return Refused(f"{subject} is isolated by {claim.isolation}: {error.message}; kubelet retries this "
                             "container by itself", code=grpc.StatusCode.UNAVAILABLE)
    return Refused(
        f"{subject} is isolated by {claim.isolation} (status.isolation, from its class), which this node cannot "
        f"provide: {error.message}. The node's GPUs do not list it in status.isolation, so the claim should not "
        "have bound here: delete the claim and the pod to bind again elsewhere, or ask the node's admin to install it"
    )


def claim_of(request: ContainerRequest) -> tuple[str, str] | None:
    """(namespace, name) of the claim this container uses, None if it uses none; raises Refused
    for an annotation that cannot name a claim of the pod's namespace."""
    container, pod = request.container, request.pod
    reference = request.pod_annotations.get(names.claim_annotation(container))
    inline = names.inline_request_annotation(container) in request.pod_annotations
    if reference is not None and inline:
        raise Refused(
            f"pod {pod}: container {container!r} has both {names.claim_annotation(container)} and "
            f"{names.inline_request_annotation(container)}; a container uses one claim: keep one of the two"
        )
    if inline:
        return pod.namespace, pod_claims.inline_claim_name(pod.name, container)
    if reference is None:
        return None
    if "/" in reference:
        raise Refused(
            f"pod {pod}: annotation {names.claim_annotation(container)}={reference!r} names a claim of another "
            f"namespace; claims are namespaced and a pod uses claims of its own namespace ({pod.namespace}) only: "
            "create the claim in this namespace and write its bare name"
        )
    if not pod_claims.is_dns1123_subdomain(reference):
        raise Refused(
            f"pod {pod}: annotation {names.claim_annotation(container)}={reference!r} is not a claim name "
            "(a DNS-1123 name: lowercase letters, digits, '-' and '.'); write the name of an ElasticGPUClaim"
        )
    return pod.namespace, reference


def without_ours(request: ContainerRequest) -> tuple[list[tuple[str, str]], list[str], dict[str, str]]:
    """The request's env, CDI devices and annotations with everything we own taken out."""
    envs = [(k, v) for k, v in request.envs if not _our_env(k)]
    devices = [d for d in request.cdi_devices if not is_ours(d)]
    annotations = {}
    for key, value in request.annotations.items():
        if key in _OURS_ANNOTATIONS:
            continue  # only we may say which claim a container uses, and what isolates it
        if key.startswith(CDI_ANNOTATION_PREFIX):
            kept = [d.strip() for d in value.split(",") if d.strip() and not is_ours(d.strip())]
            if not kept:
                continue
            value = ",".join(kept)
        annotations[key] = value
    return envs, devices, annotations


_ADVISORY_ONLY = isolation.IsolationRooms()


def decide(
    request: ContainerRequest,
    view: AgentView,
    *,
    holders: Collection[PodRef] = (),
    settings: InjectionSettings = InjectionSettings(),
    rooms: isolation.IsolationRooms = _ADVISORY_ONLY,
    nics: rdma.RdmaRoom = rdma.NO_RDMA,
    dra_devices: Collection[str] = (),
) -> ContainerEdit:
    """The edit for this container, or raise Refused (see the module docstring).

    `dra_devices`: the CDI devices the agent's DRA driver prepared for this container's pod (the
    ResourceClaims reserved for it, from the driver's checkpoint: never from what the pod says).

    `holders`: pods with a live or starting container on the claim (the ledger's open rows); `rooms`:
    the isolation modes of the node, whose room for the claim's mode contributes a slice's limits
    (only mode None by default). Pure: the room's `prepare` (its node-side work) is the caller's.
    """
    key = claim_of(request)
    envs, devices, annotations = without_ours(request)
    asked = [d for d in request.cdi_devices if is_ours(d)]
    if key is None and asked and dra_devices and set(asked) <= set(dra_devices):
        # OBSERVATION: kubelet gave the container devices our DRA driver prepared for this pod: it is
        # DRA's, as kubelet made it (its claim's CDI spec sets NVIDIA_VISIBLE_DEVICES and the limits).
        # A cdi.k8s.io/ annotation naming ours is still dropped: only the CRI field is kubelet's.
        return ContainerEdit(envs=tuple(request.envs), cdi_devices=tuple(request.cdi_devices), annotations=annotations)
    if key is None:
        access = view.node_gpu_access(request.pod.namespace)
        if access:
            # OBSERVATION: no claim, in a namespace the platform team gave the node's GPUs.
            kept = {k: v for k, v in request.annotations.items()
                    if k not in _OURS_ANNOTATIONS}
            return ContainerEdit(envs=tuple(request.envs), cdi_devices=tuple(request.cdi_devices), annotations=kept)
        if request.privileged and settings.refuse_privileged and request.pod.namespace not in (
            settings.privileged_namespaces
        ) and not any(pods.matches(request.pod, request.pod_labels) for pods in settings.privileged_pods):
            # Unknown cards (None) count as cards: a starting agent must not hand a privileged
            # container every card only because discovery has not run yet (issue 23.6).
            node_cards = view.has_cards()
            if node_cards is None:
                _refuse_privileged_unknown(request, view, access)
            elif node_cards:
                _refuse_privileged(request, view, access)
        # OBSERVATION: no claim. Our devices are gone; the NVIDIA hook must not see `all`.
        if settings.neutralise_unclaimed:
            envs.append((ENV_VISIBLE_DEVICES, VISIBLE_NONE))
        else:
            envs = list(request.envs)
        return ContainerEdit(envs=tuple(envs), cdi_devices=tuple(devices), annotations=annotations)

    namespace, name = key
    claim = _checked_claim(request, view, namespace, name, holders)
    if request.privileged and not claim.allow_privileged:
        _refuse_privileged_claim(request, view, claim)
    cards = _cards(request, view, claim)
    ours = tuple(cdi_device(card.uuid) for card in cards)
    try:
        # RDMA NICs (issue 27) come from their own room, as a slice's limits come from its mode's.
        ours += nics.devices(claim.nics)
    except rdma.MissingNic as e:
        raise Refused(f"pod {request.pod}, container {request.container!r}, claim {claim.namespace}/"
                            f"{claim.name}: {e.message}") from e
    if settings.cdi_form in (CdiForm.FIELD, CdiForm.BOTH):
        devices.extend(ours)
    if settings.cdi_form in (CdiForm.ANNOTATION, CdiForm.BOTH):
        annotations[CDI_ANNOTATION_KEY] = ",".join(ours)
    annotations[CLAIM_ANNOTATION] = f"{claim.namespace}/{claim.name}"
    envs.append((ENV_VISIBLE_DEVICES, ",".join(card.uuid for card in cards)))
    mounts: tuple[isolation.Mount, ...] = ()
    if (slice_ := slice_of(claim, request.pod, request.container, user=request.run_as_user)) is not None:
        # A slice: its claim's isolation mode says how its size is enforced (isolation/, one room per
        # mode). Device ordinals are the container's: 0..n-1 in our order.
        try:
            contribution = rooms.room(claim.isolation).contribute(slice_)
        except isolation.Unavailable as e:
            raise unavailable(request, claim, e) from e
        envs.extend(contribution.envs)
        annotations.update(contribution.annotations)
        mounts = contribution.mounts
    return ContainerEdit(
        envs=tuple(envs), cdi_devices=tuple(devices), annotations=annotations, claim=claim, devices=ours,
        mounts=mounts,
    )


def _what_to_do(request: ContainerRequest) -> str:
    container, namespace = request.container, request.pod.namespace
    return (
        f"Give the container a claim (annotation {names.claim_annotation(container)}: <claim>, or "
        f"{names.inline_request_annotation(container)}), drop `privileged` (add only the capabilities it needs), "
        f"or, for the node's own GPU tools, ask the platform team to label namespace {namespace} "
        f"{NODE_GPU_ACCESS_LABEL}=true"
    )


def _refuse_privileged_unknown(request: ContainerRequest, view: AgentView, access: bool | None) -> None:
    # Retryable and without an Event: the node may turn out to have no card at all.
    message = (
        f"pod {request.pod}, container {request.container!r} is privileged and uses no ElasticGPUClaim; the "
        f"elasticgpu agent on node {view.node_name} is starting and does not know the node's GPUs yet (its "
        "discovery has not run), and a privileged container would see every card; kubelet retries this container "
        "by itself"
    )
    if access is not None:  # the namespace could be read: say how to pass for good
        message += f". {_what_to_do(request)}"
    raise Refused(message, code=grpc.StatusCode.UNAVAILABLE)


def _refuse_privileged(request: ContainerRequest, view: AgentView, access: bool | None) -> None:
    pod, container = request.pod, request.container
    if access is None:
        raise Refused(
            f"pod {pod}, container {container!r} is privileged and uses no ElasticGPUClaim; the elasticgpu agent on "
            f"node {view.node_name} cannot read namespace {pod.namespace} now to see whether it may use the node's "
            f"GPUs ({NODE_GPU_ACCESS_LABEL}); kubelet retries this container by itself",
            code=grpc.StatusCode.UNAVAILABLE,
        )
    message = (
        f"pod {pod}, container {container!r} is privileged and uses no ElasticGPUClaim, on node {view.node_name}, "
        "which has GPUs: a privileged container sees every card of the node, those other pods' claims hold "
        f"included. {_what_to_do(request)}"
    )
    view.warn(pod, PRIVILEGED_REASON, message)
    raise Refused(message)


def _refuse_privileged_claim(request: ContainerRequest, view: AgentView, claim: ClaimInfo) -> None:
    """A privileged container gets every device of the node (the runtime adds the host's /dev), the cards
    of other tenants' claims included: the claim's size cannot hold there, so it is not handed out quietly."""
    held = (f"{claim.cores}% of a card" if not claim.whole_cards else
            f"{len(claim.gpus)} whole card{'s' if len(claim.gpus) != 1 else ''}")
    message = (
        f"pod {request.pod}, container {request.container!r} is privileged and uses ElasticGPUClaim "
        f"{claim.namespace}/{claim.name} ({held}): a privileged container gets every device of node "
        f"{view.node_name}, the cards other claims hold included, so the claim cannot confine it. Drop "
        "`privileged: true` from the container's securityContext (add only the capabilities it needs), or use a "
        f"claim of an ElasticGPUClass with {ALLOW_PRIVILEGED_FIELD}: true (a platform admin's choice: its "
        "privileged containers see every card of their node)"
    )
    view.warn(request.pod, PRIVILEGED_CLAIM_REASON, message)
    raise Refused(message)


def _checked_claim(
    request: ContainerRequest, view: AgentView, namespace: str, name: str, holders: Collection[PodRef]
) -> ClaimInfo:
    pod, container = request.pod, request.container
    subject = f"pod {pod}, container {container!r}: ElasticGPUClaim {namespace}/{name}"
    if (reason := view.not_ready_reason()) is not None:
        raise Refused(
            f"{subject}: the elasticgpu agent on node {view.node_name} is not ready yet ({reason}); "
            "kubelet retries this container by itself",
            code=grpc.StatusCode.UNAVAILABLE,
        )
    try:
        claim = view.claim(namespace, name)
    except Exception as e:  # the view may read the API server on demand; it may fail
        raise Refused(
            f"{subject}: the elasticgpu agent on node {view.node_name} could not read it "
            f"({type(e).__name__}: {e}); kubelet retries this container by itself",
            code=grpc.StatusCode.UNAVAILABLE,
        ) from e
    if claim is None:
        raise Refused(
            f"{subject} does not exist: create it, or fix the annotation {names.claim_annotation(container)}"
        )
    if claim.namespace != pod.namespace:
        raise Refused(
            f"{subject} belongs to namespace {claim.namespace}; a pod uses claims of its own namespace "
            f"({pod.namespace}) only: create the claim there"
        )
    if claim.phase != "Bound":
        raise Refused(
            f"{subject} is {claim.phase or 'Pending'}, not Bound: wait until `kubectl get egpuc -n {namespace} {name}` "
            "shows Bound (its events say why not); the pod should not have been scheduled yet: is its "
            "scheduling gate elasticgpu.io/claims removed by hand?"
        )
    if claim.node_name != view.node_name:
        raise Refused(
            f"{subject} is bound to a card on node {claim.node_name}, but the pod runs on node {view.node_name}: "
            f"delete the pod so that it is scheduled to {claim.node_name}, or use another claim"
        )
    if not claim.users:
        raise Refused(
            f"{subject} names no pod in status.users: the controller records the pod a claim serves before "
            "it lifts the pod's scheduling gate elasticgpu.io/claims; a pod created while the elasticgpu "
            "admission webhook was not running was never gated: delete it so that its controller recreates it"
        )
    if not any(user.is_pod(pod) for user in claim.users):
        served = ", ".join(f"{claim.namespace}/{user.name}" for user in claim.users)
        raise Refused(
            f"{subject} serves pod {served} (status.users); a claim serves one pod at a time (like a "
            "ReadWriteOnce volume): give each pod its own claim (an inline elasticgpu.io/request.<container> "
            "annotation does that for every replica), or delete the other pod"
        )
    others = sorted({holder for holder in holders if holder.uid != pod.uid}, key=str)
    if others:
        raise Refused(
            f"{subject} is still in use by pod {others[0]}, whose container on this node has not stopped; "
            "kubelet retries once it has (a claim serves one pod at a time)"
        )
    if not claim.gpus:
        raise Refused(f"{subject} is Bound but names no card; the controller repairs this, kubelet retries")
    return claim


def _cards(request: ContainerRequest, view: AgentView, claim: ClaimInfo) -> list[CardInfo]:
    cards = []
    for uuid in claim.gpus:
        card = view.card(uuid)
        if card is None:
            raise Refused(
                f"pod {request.pod}, container {request.container!r}: card {uuid} of ElasticGPUClaim "
                f"{claim.namespace}/{claim.name} is not known to the elasticgpu agent on node {view.node_name} "
                "(not discovered yet, or removed); kubelet retries",
                code=grpc.StatusCode.UNAVAILABLE,
            )
        cards.append(card)
    return cards
