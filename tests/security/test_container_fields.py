"""docs/security.md, the rows the node agent reads from a container as kubelet hands it over (pure
decisions, injection.decide, with a plain view): what a tenant may put in its pod spec under `edit`
(env, CDI device names, annotations that kubelet passes to the runtime, privileged) gives no card
and no claim beyond the pod's own claim."""

from __future__ import annotations

import pytest

from elasticgpu.agent import isolation, rdma
from elasticgpu.agent.injecting import hooks, injection
from elasticgpu.agent.injecting.injection import ContainerRequest, PodRef
from elasticgpu.agent.injecting.mig_annotation import MIG_ANNOTATION
from tests.agent.cri.node import CARDS, View, slice_claim

pytestmark = pytest.mark.timeout(30)

FORGED = {
    injection.CLAIM_ANNOTATION: "other-team/their-claim",
    MIG_ANNOTATION: f"uuid=MIG-x;profile=7g.80gb;start=0;card={CARDS[1].uuid};gpuInstance=0;computeInstance=0",
    isolation.ANNOTATION_MODE: "None",
    isolation.ANNOTATION_CARDS: CARDS[1].uuid,
    f"{injection.CDI_ANNOTATION_PREFIX}mine": injection.cdi_device(CARDS[1].uuid),
}
"""What a tenant could try to hand the runtime: the annotations only the agent sets (which claim, which
MIG instance, what isolates it: the agent reads them back for usage, policing and a ledger rebuild) and
a CDI request for another card."""


def _request(*, claim: str | None, privileged: bool = False) -> ContainerRequest:
    return ContainerRequest(
        pod=PodRef("team", "pod", "uid-1"),
        pod_annotations={"egpuc.elasticgpu.io/main": claim} if claim else {},
        container="main",
        envs=[("NVIDIA_VISIBLE_DEVICES", "all"), ("CUDA_DEVICE_MEMORY_LIMIT", "80g"),
              ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")],
        cdi_devices=[injection.cdi_device(CARDS[1].uuid), f"{rdma.CDI_KIND}=mlx5_9"],
        annotations=FORGED,
        privileged=privileged,
    )


@pytest.mark.parametrize("claim", [None, "slice"], ids=["no claim", "a claim"])
def test_forged_container_annotations_env_and_devices_give_no_other_card(claim: str | None) -> None:
    view = View()
    view.add(slice_claim("team", "slice", user="pod"))
    edit = injection.decide(_request(claim=claim), view)
    mine = {CARDS[0].uuid} if claim else set()
    # Only the agent's own values of its annotations are left (the claim's name, for a claim).
    ours = {k: v for k, v in edit.annotations.items() if k in FORGED}
    assert ours.get(injection.CLAIM_ANNOTATION) == ("team/slice" if claim else None), edit.annotations
    assert MIG_ANNOTATION not in ours and ours.get(isolation.ANNOTATION_CARDS, "") != CARDS[1].uuid
    assert not any(CARDS[1].uuid in v for v in edit.annotations.values()), edit.annotations
    # Devices: exactly the claim's cards, none of the ones the spec named.
    assert {d.split("=", 1)[1] for d in edit.cdi_devices if injection.is_ours(d)} == mine, edit.cdi_devices
    env = dict(edit.envs)
    assert env["NVIDIA_VISIBLE_DEVICES"] == (CARDS[0].uuid if claim else "void"), env
    if claim:  # the slice's limits replace the spec's, never the other way round
        assert env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != "100", env


def test_a_privileged_container_with_a_claim_is_refused_unless_its_class_allows_it() -> None:
    """Issue 33 item 4 (depends on its fix): a privileged container is root on its node and sees every
    card whatever it is given, so a claim in one would quietly hand it other tenants' cards; unless an
    admin's class allows privileged use, the agent refuses it, saying why."""
    view = View()
    view.add(slice_claim("team", "slice", user="pod"))
    with pytest.raises(hooks.Refused) as refused:
        injection.decide(_request(claim="slice", privileged=True), view)
    assert "privileged" in refused.value.message
