"""A container of a ResourceClaim our DRA driver prepared is a ledger row like ours (issue 48): the real
SQLite ledger and its Alembic revisions, the real checkpoint, the real isolation rooms (MPS over a stand-in
control binary, HAMi-core over a stand-in library). Started before the runtime is called, created, released;
a kill -9 in between is settled by the start-up reconcile; usage, policing and the metrics know the claim as
`resourceclaim/<name>`; the controller's runningClaims do not list it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from elasticgpu.agent import holders, usage
from elasticgpu.agent.discovery.models import ProcessUsage
from elasticgpu.agent.dra import checkpoint
from elasticgpu.agent.injecting import claim_hooks, hooks, injection
from elasticgpu.agent.ledger import models, store
from tests.agent.cri.isolation_node import IsolationNode
from tests.agent.cri.test_injection import CARD_A, CARD_B, POD, claim, request, view

CARD = f"elasticgpu.io/gpu={CARD_A}"
UID = "uid-rc"
CLAIM_ID = f"elasticgpu.io/claim={UID}"


def prepared(tmp_path: Path, *, cores: int = 30, memory_mib: int = 10240, mode: str = "None",
             whole: bool = False) -> checkpoint.Checkpoint:  # fmt: skip
    """A checkpoint holding claim team/rc, prepared for POD (as the driver writes it at prepare)."""
    cp = checkpoint.Checkpoint(tmp_path / "dra.json")
    device = checkpoint.PreparedDevice(requests=("gpu",), pool="node-a", device="gpu-0", uuid=CARD_A,
                                       cdi_ids=(CARD, CLAIM_ID), cores=cores, memory_mib=memory_mib,
                                       whole=whole)  # fmt: skip
    cp.put(checkpoint.ClaimEntry(uid=UID, namespace="team", name="rc", state=checkpoint.COMPLETED,
                                 devices=(device,), pods=(POD.uid,), isolation=mode))  # fmt: skip
    return cp


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[store.LedgerStore]:
    opened = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield opened
    opened.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[IsolationNode]:
    made = IsolationNode(tmp_path / "iso")
    yield made
    made.close()


def make_hooks(ledger: store.LedgerStore, cp: checkpoint.Checkpoint, node: IsolationNode | None = None,
               *claims: injection.ClaimInfo) -> claim_hooks.ClaimHooks:  # fmt: skip
    made = claim_hooks.ClaimHooks(view=view(*claims), ledger=ledger, rooms=node.rooms if node else None,
                                  dra_claims=cp.claims_of_pod)  # fmt: skip
    made.reconcile([], starting=True)
    return made


def dra_request(**changes: object) -> injection.ContainerRequest:
    return request(devices=[CARD, CLAIM_ID], **changes)  # type: ignore[arg-type]


def test_a_dra_container_is_a_ledger_row_started_created_released(tmp_path: Path, ledger: store.LedgerStore) -> None:
    made = make_hooks(ledger, prepared(tmp_path))
    prepared_create = made.prepare_create(dra_request())
    (row,) = ledger.open_allocations()
    assert (row.state, row.claim_kind, row.claim_namespace, row.claim_name, row.elastic_gpu) == (
        models.STARTED, models.KIND_DRA, "team", "rc", UID)
    assert (row.gpu_uuids, row.cores, row.memory_mib, row.limits_file) == ((CARD_A,), 30, 10240, False)
    assert row.claim_key == ("team", "resourceclaim/rc")
    edit = prepared_create.edit
    assert edit.cdi_devices == (CARD, CLAIM_ID)  # kubelet's devices stay
    assert edit.annotations[injection.RESOURCE_CLAIM_ANNOTATION] == "team/rc"
    made.created(prepared_create, "c-1")
    made.flush()
    assert ledger.allocation_for_container("c-1").state == models.CREATED  # type: ignore[union-attr]
    made.removed("c-1")
    made.flush()
    assert ledger.open_allocations() == []
    assert ledger.allocation_for_container("c-1").state == models.RELEASED  # type: ignore[union-attr]
    made.close()


def test_a_forged_marker_does_not_make_a_claimless_container_dra_s(tmp_path: Path, ledger: store.LedgerStore) -> None:
    made = make_hooks(ledger, prepared(tmp_path))
    edit = made.prepare_create(request(container_annotations={injection.RESOURCE_CLAIM_ANNOTATION: "team/rc"})).edit
    assert injection.RESOURCE_CLAIM_ANNOTATION not in edit.annotations
    assert dict(edit.envs)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert ledger.open_allocations() == []
    made.close()


@pytest.mark.parametrize("created", [True, False])
def test_kill_9_between_started_and_created_is_settled_at_start(tmp_path: Path, ledger: store.LedgerStore,
                                                                created: bool) -> None:  # fmt: skip
    """The agent recorded `started`, then died; the runtime did (or did not) create the container."""
    cp = prepared(tmp_path)
    first = make_hooks(ledger, cp)
    edit = first.prepare_create(dra_request()).edit
    first.close()  # the agent is gone: nothing after `started` was written
    containers = [hooks.RuntimeContainer(
        id="c-9", name="main", labels={injection.LABEL_POD_UID: POD.uid}, annotations=edit.annotations,
        created_at=1)] if created else []  # fmt: skip
    again = claim_hooks.ClaimHooks(view=view(), ledger=ledger, dra_claims=cp.claims_of_pod)
    again.reconcile(containers, starting=True)
    if created:
        (row,) = ledger.open_allocations()
        assert (row.state, row.container_id, row.claim_kind) == (models.CREATED, "c-9", models.KIND_DRA)
    else:
        assert ledger.open_allocations() == []
    again.close()


def test_a_started_row_of_dra_is_not_matched_by_our_claim_annotation(tmp_path: Path,
                                                                     ledger: store.LedgerStore) -> None:
    """An ElasticGPUClaim container of the same pod, container name and claim name is not the DRA row's."""
    cp = prepared(tmp_path)
    first = make_hooks(ledger, cp)
    first.prepare_create(dra_request())
    first.close()
    ours = hooks.RuntimeContainer(id="c-ours", name="main", labels={injection.LABEL_POD_UID: POD.uid},
                                  annotations={injection.CLAIM_ANNOTATION: "team/rc"}, created_at=1)  # fmt: skip
    again = claim_hooks.ClaimHooks(view=view(), ledger=ledger, dra_claims=cp.claims_of_pod)
    again.reconcile([ours], starting=True)
    assert ledger.open_allocations() == []
    again.close()


def test_a_dra_slice_gets_its_class_s_mps_room(tmp_path: Path, ledger: store.LedgerStore,
                                               node: IsolationNode) -> None:  # fmt: skip
    made = make_hooks(ledger, prepared(tmp_path, mode="MPS"), node)
    edit = made.prepare_create(dra_request(envs=[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")])).edit
    env = dict(edit.envs)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"  # the tenant's own value is replaced
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["NVIDIA_VISIBLE_DEVICES"] == CARD_A
    assert edit.annotations["elasticgpu.io/isolation"] == "MPS"
    assert any(m.container_path == "/run/nvidia-mps" for m in edit.mounts)
    assert node.starts() == [CARD_A]  # the card's daemon runs before the container is created
    made.close()


def test_a_dra_slice_gets_its_class_s_hami_core_room(tmp_path: Path, ledger: store.LedgerStore,
                                                     node: IsolationNode) -> None:  # fmt: skip
    made = make_hooks(ledger, prepared(tmp_path, mode="HAMiCore"), node)
    edit = made.prepare_create(dra_request()).edit
    env = dict(edit.envs)
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == ("10240m", "30")
    assert {m.container_path for m in edit.mounts} >= {"/usr/local/vgpu/libvgpu.so", "/etc/ld.so.preload"}
    made.close()


def test_a_mode_the_node_lacks_refuses_the_container_naming_the_class(tmp_path: Path,
                                                                      ledger: store.LedgerStore) -> None:
    made = make_hooks(ledger, prepared(tmp_path, mode="MPS"))  # no MPS room on this node
    with pytest.raises(hooks.Refused, match="isolated by MPS \\(its DeviceClass's config\\)") as refused:
        made.prepare_create(dra_request())
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert ledger.open_allocations() == []  # nothing given, nothing recorded
    made.close()


def test_whole_cards_and_mode_none_get_no_room(tmp_path: Path, ledger: store.LedgerStore,
                                               node: IsolationNode) -> None:  # fmt: skip
    made = make_hooks(ledger, prepared(tmp_path, cores=100, memory_mib=81920, whole=True, mode="MPS"), node)
    edit = made.prepare_create(dra_request()).edit
    assert edit.mounts == () and "elasticgpu.io/isolation" not in edit.annotations
    (row,) = ledger.open_allocations()
    assert (row.cores, row.memory_mib) == (100, 0)
    assert node.starts() == []
    made.close()


def test_a_dra_row_never_holds_an_elasticgpu_claim_of_the_same_name(tmp_path: Path,
                                                                    ledger: store.LedgerStore) -> None:
    """Another pod's ElasticGPUClaim team/rc on another card starts beside the ResourceClaim team/rc."""
    ours = claim(name="rc", gpus=(CARD_B,), users=(injection.ClaimUser("other", "uid-other"),))
    made = make_hooks(ledger, prepared(tmp_path), None, ours)
    made.prepare_create(dra_request())
    other = injection.PodRef("team", "other", "uid-other")
    made.prepare_create(request({"egpuc.elasticgpu.io/main": "rc"}, pod=other))
    kinds = sorted(row.claim_kind for row in ledger.open_allocations())
    assert kinds == sorted([models.KIND_DRA, models.KIND_ELASTIC])
    made.close()


def test_running_claims_leave_dra_rows_out_and_usage_names_them(tmp_path: Path, ledger: store.LedgerStore) -> None:
    made = make_hooks(ledger, prepared(tmp_path))
    made.created(made.prepare_create(dra_request()), "c-1")
    made.flush()
    rows = ledger.open_allocations()
    assert holders.running_claims(rows) == {}  # not an ElasticGPUClaim: the controller must not see it as ours
    process = ProcessUsage(gpu_uuid=CARD_A, pid=7, memory_mib=12000, sm_percent=20)
    claims, attributed = usage.attribute([process], rows, lambda pid: "c-1")
    (key,) = claims
    assert key == ("team", "resourceclaim/rc")
    assert (claims[key].reserved_mib, claims[key].memory_mib, claims[key].over_limit) == (10240, 12000, True)
    assert attributed[0][1] is not None and attributed[0][1].is_dra
    made.close()


def test_revision_0005_marks_old_rows_ours_and_its_downgrade_drops_dra_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = store.make_engine(url)
    store.downgrade(engine, url, "base")
    from alembic import command  # the one step to 0004, as an older agent left the file

    config = store.alembic_config(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0004")
    now = datetime.now(UTC)
    with engine.begin() as connection:
        connection.execute(text(
            "INSERT INTO allocations (state, container_id, pod_uid, pod_namespace, pod_name, container_name,"
            " claim_namespace, claim_name, elastic_gpu, gpu_uuids, cores, memory_mib, started_at)"
            " VALUES ('created', 'c-old', 'u', 'team', 'p', 'main', 'team', 'old', 'egpu-1', '[]', 30, 1024, :now)"),
            {"now": now})  # fmt: skip
    engine.dispose()
    opened = store.LedgerStore.open(url)
    (old,) = opened.open_allocations()
    assert (old.claim_kind, old.is_dra) == (models.KIND_ELASTIC, False)
    opened.record_started(pod_uid="u2", pod_namespace="team", pod_name="q", container_name="main",
                          claim_namespace="team", claim_name="rc", elastic_gpu=UID, gpu_uuids=[CARD_A], cores=30,
                          memory_mib=1024, claim_kind=models.KIND_DRA)  # fmt: skip
    with pytest.raises(ValueError, match="claim_kind 'x'"):
        opened.record_started(pod_uid="u3", pod_namespace="team", pod_name="q", container_name="main",
                              claim_namespace="team", claim_name="rc", elastic_gpu="", gpu_uuids=[], cores=30,
                              memory_mib=1024, claim_kind="x")  # fmt: skip
    opened.close()
    engine = store.make_engine(url)
    store.downgrade(engine, url, "0004")
    with engine.connect() as connection:
        names = [row[0] for row in connection.execute(text("SELECT claim_name FROM allocations"))]
    engine.dispose()
    assert names == ["old"]  # an older agent would take the ResourceClaim's row for an ElasticGPUClaim's


def test_a_lost_ledger_is_rebuilt_with_the_dra_container_s_row(tmp_path: Path, ledger: store.LedgerStore) -> None:
    """A corrupt ledger set aside: the running DRA container gets its row back from its marker and the checkpoint."""
    from elasticgpu.agent.injecting import gated

    labels = {injection.LABEL_POD_UID: POD.uid, injection.LABEL_POD_NAMESPACE: "team",
              injection.LABEL_POD_NAME: "trainer"}  # fmt: skip
    running = hooks.RuntimeContainer(id="c-1", name="main", labels=labels,
                                     annotations={injection.RESOURCE_CLAIM_ANNOTATION: "team/rc"})  # fmt: skip
    unprepared = hooks.RuntimeContainer(id="c-2", name="main", labels={injection.LABEL_POD_UID: "uid-gone"},
                                        annotations={injection.RESOURCE_CLAIM_ANNOTATION: "team/rc"})  # fmt: skip
    cp = prepared(tmp_path)
    assert gated.rebuild(ledger, [running, unprepared], lambda _: {}, view(), dra_claims=cp.claims_of_pod) == 1
    (row,) = ledger.open_allocations()
    assert (row.container_id, row.claim_kind, row.claim_name, row.cores, row.memory_mib) == (
        "c-1", models.KIND_DRA, "rc", 30, 10240)
    assert gated.rebuild(ledger, [running], lambda _: {}, view(), dra_claims=cp.claims_of_pod) == 0  # idempotent
