"""Injection decisions (elasticgpu/agent/injecting/injection.py): a table of cases, and invariants."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticgpu.agent.cri import translating
from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.injecting.injection import CardInfo, ClaimInfo, ClaimUser, ContainerRequest, PodRef

NODE = "node-a"
CARD_A = "GPU-0a1b2c3d-0000-0000-0000-00000000000a"
CARD_B = "GPU-0a1b2c3d-0000-0000-0000-00000000000b"
POD = PodRef("team", "trainer", "uid-trainer")
OTHER_POD = PodRef("team", "other", "uid-other")


@dataclass
class View:
    """The agent's view, as plain objects."""

    node_name: str = NODE
    reason: str | None = None
    claims: dict[tuple[str, str], ClaimInfo] = field(default_factory=dict)
    cards: dict[str, CardInfo] = field(default_factory=dict)
    gpu_access: dict[str, bool | None] = field(default_factory=dict)
    warnings: list[tuple[PodRef, str, str]] = field(default_factory=list)

    def not_ready_reason(self) -> str | None:
        return self.reason

    def has_cards(self) -> bool:
        return bool(self.cards)

    def node_gpu_access(self, namespace: str) -> bool | None:
        return self.gpu_access.get(namespace, False)

    def warn(self, pod: PodRef, reason: str, message: str) -> None:
        self.warnings.append((pod, reason, message))

    def claim(self, namespace: str, name: str) -> ClaimInfo | None:
        return self.claims.get((namespace, name))

    def card(self, uuid: str) -> CardInfo | None:
        return self.cards.get(uuid.lower())


def claim(name: str = "slice", **changes: object) -> ClaimInfo:
    base = ClaimInfo(
        namespace="team",
        name=name,
        phase="Bound",
        node_name=NODE,
        elastic_gpu=f"egpu-{name}",
        gpus=(CARD_A,),
        cores=30,
        memory_mib=10240,
        users=(ClaimUser("trainer"),),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def view(*claims: ClaimInfo, **changes: object) -> View:
    cards = {
        CARD_A.lower(): CardInfo(uuid=CARD_A, index=0, memory_mib=81920),
        CARD_B.lower(): CardInfo(uuid=CARD_B, index=1, memory_mib=81920),
    }
    result = View(claims={(c.namespace, c.name): c for c in claims}, cards=cards)
    for key, value in changes.items():
        setattr(result, key, value)
    return result


def request(
    annotations: dict[str, str] | None = None,
    *,
    container: str = "main",
    envs: list[tuple[str, str]] | None = None,
    devices: list[str] | None = None,
    container_annotations: dict[str, str] | None = None,
    pod: PodRef = POD,
) -> ContainerRequest:
    return ContainerRequest(
        pod=pod,
        pod_annotations=annotations or {},
        container=container,
        envs=envs or [],
        cdi_devices=devices or [],
        annotations=container_annotations or {},
    )


def env(edit: injection.ContainerEdit) -> dict[str, str]:
    """The env as a dict; each of our variables must appear once (the spec's own may repeat)."""
    ours = [k for k, _ in edit.envs if k.startswith(("NVIDIA_", "CUDA_"))]
    assert len(ours) == len(set(ours)), f"one of our variables appears twice: {ours}"
    return dict(edit.envs)


USES_SLICE = {"egpuc.elasticgpu.io/main": "slice"}


def test_slice_claim_gets_its_card_and_limits() -> None:
    edit = injection.decide(request(USES_SLICE, envs=[("NVIDIA_VISIBLE_DEVICES", "all"), ("KEEP", "1")]), view(claim()))
    assert edit.cdi_devices == (f"elasticgpu.io/gpu={CARD_A}",)
    assert edit.annotations == {"elasticgpu.io/claim": "team/slice"}
    assert env(edit) == {
        "KEEP": "1",
        "NVIDIA_VISIBLE_DEVICES": CARD_A,
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "10240m",
    }
    assert edit.claim == claim()


def test_a_slice_of_memory_only_gets_no_compute_limit() -> None:
    memory_only = claim("memory", cores=0, memory_mib=4096)
    edit = injection.decide(request({"egpuc.elasticgpu.io/main": "memory"}), view(memory_only))
    assert env(edit) == {
        "NVIDIA_VISIBLE_DEVICES": CARD_A,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
    }


def test_whole_cards_get_devices_and_no_limits() -> None:
    whole = claim("pair", gpus=(CARD_A, CARD_B), cores=100, memory_mib=0)
    edit = injection.decide(request({"egpuc.elasticgpu.io/main": "pair"}), view(whole))
    assert edit.cdi_devices == (f"elasticgpu.io/gpu={CARD_A}", f"elasticgpu.io/gpu={CARD_B}")
    assert env(edit) == {"NVIDIA_VISIBLE_DEVICES": f"{CARD_A},{CARD_B}"}


def test_inline_request_uses_the_pods_own_claim() -> None:
    own = claim("trainer-main")
    edit = injection.decide(request({"elasticgpu.io/request.main": "gpu-core=30,gpu-memory=10Gi"}), view(own))
    assert edit.claim == own


def test_two_containers_of_one_pod_share_a_claim() -> None:
    both = {"egpuc.elasticgpu.io/main": "slice", "egpuc.elasticgpu.io/helper": "slice"}
    # The first container of this pod already holds the claim: the second is let in.
    edit = injection.decide(request(both, container="helper"), view(claim()), holders=[POD])
    assert edit.devices == (f"elasticgpu.io/gpu={CARD_A}",)


def test_unclaimed_container_is_neutralised() -> None:
    ours = f"elasticgpu.io/gpu={CARD_A}"
    edit = injection.decide(
        request(
            USES_SLICE,
            container="sidecar",
            envs=[("NVIDIA_VISIBLE_DEVICES", "all"), ("CUDA_DEVICE_SM_LIMIT", "100"), ("A", "b")],
            devices=[ours, "vendor.example/fpga=0"],
            container_annotations={
                "cdi.k8s.io/mine": f"{ours},vendor.example/fpga=1",
                "cdi.k8s.io/only-ours": ours,
                "elasticgpu.io/claim": "team/slice",
                "keep": "me",
            },
        ),
        view(reason="starting"),  # not consulted for a container without a claim
    )
    assert edit.cdi_devices == ("vendor.example/fpga=0",)
    assert edit.annotations == {"cdi.k8s.io/mine": "vendor.example/fpga=1", "keep": "me"}
    assert env(edit) == {"A": "b", "NVIDIA_VISIBLE_DEVICES": "void"}
    assert edit.claim is None


def test_neutralising_can_be_turned_off() -> None:
    settings = injection.InjectionSettings(neutralise_unclaimed=False)
    edit = injection.decide(request(envs=[("NVIDIA_VISIBLE_DEVICES", "all")]), view(), settings=settings)
    assert env(edit) == {"NVIDIA_VISIBLE_DEVICES": "all"}


@pytest.mark.parametrize(
    ("form", "devices", "annotation"),
    [
        (injection.CdiForm.FIELD, (f"elasticgpu.io/gpu={CARD_A}",), None),
        (injection.CdiForm.ANNOTATION, (), f"elasticgpu.io/gpu={CARD_A}"),
        (injection.CdiForm.BOTH, (f"elasticgpu.io/gpu={CARD_A}",), f"elasticgpu.io/gpu={CARD_A}"),
    ],
)
def test_cdi_request_forms(form: injection.CdiForm, devices: tuple[str, ...], annotation: str | None) -> None:
    settings = injection.InjectionSettings(cdi_form=form)
    edit = injection.decide(request(USES_SLICE), view(claim()), settings=settings)
    assert edit.cdi_devices == devices
    assert edit.annotations.get("cdi.k8s.io/elasticgpu") == annotation


# (case, pod annotations, view, holders, gRPC code, words the message must contain)
REFUSALS = [
    ("claim missing", USES_SLICE, view(), [], "FAILED_PRECONDITION", ["team/slice does not exist", "create it"]),
    (
        "not bound yet",
        USES_SLICE,
        view(claim(phase="Pending", node_name=None, gpus=())),
        [],
        "FAILED_PRECONDITION",
        ["is Pending, not Bound", "kubectl get egpuc -n team slice"],
    ),
    (
        "bound to another node",
        USES_SLICE,
        view(claim(node_name="node-b")),
        [],
        "FAILED_PRECONDITION",
        ["node node-b", "runs on node node-a", "delete the pod"],
    ),
    (
        "another namespace's claim",
        {"egpuc.elasticgpu.io/main": "other-team/slice"},
        view(claim(namespace="other-team")),
        [],
        "FAILED_PRECONDITION",
        ["another namespace", "own namespace (team)"],
    ),
    (
        "view returns a claim of another namespace",
        USES_SLICE,
        View(claims={("team", "slice"): claim(namespace="other-team")}),
        [],
        "FAILED_PRECONDITION",
        ["belongs to namespace other-team"],
    ),
    (
        "claim serves another pod",
        USES_SLICE,
        view(claim(users=(ClaimUser("other"),))),
        [],
        "FAILED_PRECONDITION",
        ["serves pod team/other (status.users)", "one pod at a time", "own claim"],
    ),
    (
        "claim serves a former pod of the same name",
        USES_SLICE,
        view(claim(users=(ClaimUser("trainer", "uid-of-a-deleted-trainer"),))),
        [],
        "FAILED_PRECONDITION",
        ["serves pod team/trainer"],
    ),
    (
        "claim serves no pod yet",
        USES_SLICE,
        view(claim(users=())),
        [],
        "FAILED_PRECONDITION",
        ["names no pod in status.users", "scheduling gate"],
    ),
    (
        "another pod's container still holds it on this node",
        USES_SLICE,
        view(claim()),
        [OTHER_POD],
        "FAILED_PRECONDITION",
        ["still in use by pod team/other", "retries"],
    ),
    (
        "agent not ready",
        USES_SLICE,
        view(claim(), reason="claims not listed yet"),
        [],
        "UNAVAILABLE",
        ["not ready yet (claims not listed yet)", "retries"],
    ),
    (
        "card unknown to the agent",
        USES_SLICE,
        view(claim(gpus=("GPU-ffff",))),
        [],
        "UNAVAILABLE",
        ["card GPU-ffff", "not known"],
    ),
    (
        "both annotations",
        {**USES_SLICE, "elasticgpu.io/request.main": "gpu-core=30"},
        view(claim()),
        [],
        "FAILED_PRECONDITION",
        ["keep one of the two"],
    ),
    (
        "not a claim name",
        {"egpuc.elasticgpu.io/main": "Bad_Name"},
        view(claim()),
        [],
        "FAILED_PRECONDITION",
        ["not a claim name"],
    ),
]


@pytest.mark.parametrize(
    ("annotations", "agent", "holders", "code", "words"),
    [row[1:] for row in REFUSALS],
    ids=[row[0] for row in REFUSALS],
)
def test_refusals_say_what_to_fix(
    annotations: dict[str, str], agent: View, holders: list[PodRef], code: str, words: list[str]
) -> None:
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(annotations), agent, holders=holders)
    assert refused.value.code == getattr(grpc.StatusCode, code)
    assert "pod team/trainer" in refused.value.message
    for word in words:
        assert word in refused.value.message


# --- invariants ---

ENV_KEYS = st.sampled_from(
    [
        *("NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_SM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0"),
        *("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "PATH", "A", "B"),
    ]
)
DEVICES = st.sampled_from(
    [f"elasticgpu.io/gpu={CARD_A}", f"elasticgpu.io/gpu={CARD_B}", "elasticgpu.io/gpu=all", "nvidia.com/gpu=0", "x/y=z"]
)
ANNOTATIONS = st.dictionaries(
    st.sampled_from(["cdi.k8s.io/a", "cdi.k8s.io/b", "elasticgpu.io/claim", "elasticgpu.io/mig-instance", "other"]),
    st.lists(DEVICES, max_size=3).map(",".join),
    max_size=4,
)
POD_ANNOTATIONS = st.dictionaries(
    st.sampled_from(["egpuc.elasticgpu.io/other", "elasticgpu.io/request.other", "egpuc.elasticgpu.io/main", "x"]),
    st.sampled_from(["slice", "gpu-core=30"]),
    max_size=3,
)
CLAIMS = st.builds(
    claim,
    phase=st.sampled_from(["Bound", "Pending", "Lost"]),
    node_name=st.sampled_from([NODE, "node-b", None]),
    gpus=st.lists(st.sampled_from([CARD_A, CARD_B, "GPU-unknown"]), max_size=2, unique=True).map(tuple),
    cores=st.sampled_from([10, 30, 100]),
    memory_mib=st.sampled_from([0, 1024]),
    users=st.sampled_from([(), (ClaimUser("trainer"),), (ClaimUser("trainer", "uid-trainer"),), (ClaimUser("other"),)]),
)
REQUESTS = st.builds(
    request,
    POD_ANNOTATIONS,
    envs=st.lists(st.tuples(ENV_KEYS, st.sampled_from(["all", "0", "void", "1"])), max_size=5),
    devices=st.lists(DEVICES, max_size=4),
    container_annotations=ANNOTATIONS,
)


def ours_left(edit: injection.ContainerEdit) -> list[str]:
    from_annotations = [
        d for k, v in edit.annotations.items() if k.startswith("cdi.k8s.io/") for d in v.split(",") if d
    ]
    return [d for d in [*edit.cdi_devices, *from_annotations] if injection.is_ours(d)]


@given(REQUESTS, CLAIMS, st.lists(st.sampled_from([POD, OTHER_POD]), max_size=2), st.booleans())
def test_no_gpu_without_a_claim(req: ContainerRequest, bound: ClaimInfo, holders: list[PodRef], ready: bool) -> None:
    """Whatever its spec says, a container that names no claim leaves with no GPU of ours."""
    req = replace(req, container="sidecar")  # the pod annotations never name "sidecar"
    edit = injection.decide(req, view(bound, reason=None if ready else "starting"), holders=holders)
    assert ours_left(edit) == []
    assert env(edit)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "elasticgpu.io/claim" not in edit.annotations
    assert "elasticgpu.io/mig-instance" not in edit.annotations  # only the agent names an instance (rebuild)
    # Everything that is not ours passes in order.
    assert [d for d in edit.cdi_devices] == [d for d in req.cdi_devices if not injection.is_ours(d)]


@given(REQUESTS, CLAIMS, st.lists(st.sampled_from([POD, OTHER_POD]), max_size=2), st.booleans())
def test_a_claim_gives_exactly_its_cards_or_is_refused(
    req: ContainerRequest, bound: ClaimInfo, holders: list[PodRef], ready: bool
) -> None:
    req = replace(req, pod_annotations={"egpuc.elasticgpu.io/main": "slice"})
    agent = view(bound, reason=None if ready else "starting")
    usable = (
        ready
        and bound.phase == "Bound"
        and bound.node_name == NODE
        and any(user.is_pod(POD) for user in bound.users)
        and OTHER_POD not in holders
        and bool(bound.gpus)
        and "GPU-unknown" not in bound.gpus
    )
    try:
        edit = injection.decide(req, agent, holders=holders)
    except hooks.Refused as refused:
        assert not usable, refused.message
        return
    assert usable
    assert sorted(ours_left(edit)) == sorted(injection.cdi_device(g) for g in bound.gpus)
    assert env(edit)["NVIDIA_VISIBLE_DEVICES"] == ",".join(bound.gpus)
    assert ("CUDA_DEVICE_SM_LIMIT" in env(edit)) == (bound.cores < 100)
    assert edit.annotations["elasticgpu.io/claim"] == "team/slice"
    assert "elasticgpu.io/mig-instance" not in edit.annotations  # a user's is dropped; the MIG hooks write it


def test_rewritten_request_keeps_fields_newer_than_our_proto(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A newer kubelet's fields we do not know survive the rewrite (protobuf keeps unknown fields)."""
    from elasticgpu.agent.cri import api
    from elasticgpu.agent.injecting import claim_hooks
    from elasticgpu.agent.ledger import store
    from tests.containerd_runtime import container_config, sandbox_config

    pb = api.pb
    sandbox = sandbox_config(name="trainer", namespace="team", uid="uid-trainer")
    config = container_config(name="main", image="busybox", sandbox=sandbox, envs={"NVIDIA_VISIBLE_DEVICES": "all"})
    unknown_config_field = b"\xba\x3e\x05hello"  # field 999 of ContainerConfig, length-delimited "hello"
    config = pb.ContainerConfig.FromString(config.SerializeToString() + unknown_config_field)
    unknown_request_field = b"\xc0\x3e\x07"  # field 1000 of CreateContainerRequest, varint 7
    raw = pb.CreateContainerRequest(pod_sandbox_id="s", config=config, sandbox_config=sandbox).SerializeToString()
    request = pb.CreateContainerRequest.FromString(raw + unknown_request_field)
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        hooks = claim_hooks.ClaimHooks(view=view(), ledger=ledger)
        prepared = hooks.prepare_create(translating.container_request(request))
        hooks.close()
    finally:
        ledger.close()
    assert translating.apply(prepared.edit, request)
    out = request.SerializeToString()
    assert unknown_request_field in out and unknown_config_field in out
    assert dict((kv.key, kv.value) for kv in request.config.envs)["NVIDIA_VISIBLE_DEVICES"] == b"void"


def test_a_view_that_cannot_read_the_claim_refuses_as_retryable() -> None:
    class Unreachable(View):
        def claim(self, namespace: str, name: str) -> ClaimInfo | None:
            raise ConnectionError("API server unreachable")

    with pytest.raises(hooks.Refused) as refused:
        injection.decide(request(USES_SLICE), Unreachable())
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert "could not read it (ConnectionError: API server unreachable)" in refused.value.message
    # A container without a claim does not ask the view at all.
    assert (
        env(injection.decide(request(USES_SLICE, container="sidecar"), Unreachable()))["NVIDIA_VISIBLE_DEVICES"]
        == "void"
    )
