"""Reading a pod's claim annotations (elasticgpu.api.pod_claims): pure, no server."""

from __future__ import annotations

import pytest

from elasticgpu.api import names, pod_claims
from elasticgpu.api.errors import InvalidPodClaims
from elasticgpu.api.resources import GpuRequest

CLAIM = names.ANNOTATION_CLAIM_PREFIX
INLINE = names.ANNOTATION_INLINE_REQUEST_PREFIX


def test_references_and_inline_requests_are_read() -> None:
    claims = pod_claims.parse_pod_claims(
        {
            f"{CLAIM}main": "a100-share",
            f"{CLAIM}helper": "a100-share",
            f"{INLINE}side": "gpu-core=30, gpu-memory=10Gi ,class=fast",
            "unrelated.example.com/x": "y",
        },
        containers=["main", "helper", "side"],
    )
    assert claims.claims_by_container("web-1") == {"helper": "a100-share", "main": "a100-share", "side": "web-1-side"}
    assert claims.claim_names("web-1") == ["a100-share", "web-1-side"]
    (inline,) = claims.inline
    assert inline.request == GpuRequest.share(30, 10240)
    # The claim the controller will create, as the CRD reads it.
    assert inline.spec.to_dict() == {
        "resources": {"requests": {names.RESOURCE_CORE: 30, names.RESOURCE_MEMORY: "10Gi"}},
        "elasticGPUClassName": "fast",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu-core=30", GpuRequest.share(30)),
        ("gpu-memory=8Gi", GpuRequest.share(0, 8192)),
        ("gpu=2", GpuRequest.whole(2)),
        ("gpu-core=200,gpu-memory=40Gi", GpuRequest.whole(2, 40960)),
        (f"{names.RESOURCE_CORE}=50,{names.RESOURCE_MEMORY}=1536", GpuRequest.share(50, 1536)),
    ],
)
def test_inline_requests_normalise_like_claims(text: str, expected: GpuRequest) -> None:
    assert pod_claims.parse_inline_request(f"{INLINE}main", "main", text).request == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        ("gpu-core", "'gpu-core' is not KEY=VALUE"),
        ("gpu-core=", "is not KEY=VALUE"),
        ("cores=30", "'cores' is not a key of an inline request"),
        ("gpu-core=30,gpu-core=40", "gives gpu-core twice"),
        ("class=fast", "asks for no GPU resource"),
        # The claim's own rules (resources.parse_claim_resources), named by the key written:
        ("gpu-core=150", "gpu-core: must be 1..100 (a share of one card) or a multiple of 100"),
        ("gpu-core=0", "gpu-core: must be at least 1"),
        ("gpu-core=+30", "gpu-core must be a whole number"),
        ("gpu-core=2.5", "gpu-core must be a whole number"),
        ("gpu-memory=0", "gpu-memory: must be more than 0 MiB"),
        ("gpu-memory=10Gb", "gpu-memory: unknown suffix 'Gb'"),
        ("gpu=0", "gpu: must be at least 1 whole card"),
        ("gpu=2,gpu-core=100", "must equal 100 x nvidia.com/gpu"),
        ("gpu-core=30,class=Fast_Class", "class must be the name of an ElasticGPUClass"),
        ("gpu-core=30,class=a,class=b", "gives class twice"),
    ],
)
def test_bad_inline_requests_name_annotation_rule_and_fix(text: str, says: str) -> None:
    with pytest.raises(InvalidPodClaims) as caught:
        pod_claims.parse_pod_claims({f"{INLINE}main": text}, containers=["main"], pod="web-1")
    message = str(caught.value)
    assert says in message
    assert message.startswith(f"pod web-1: metadata.annotations[{INLINE}main]: ")


@pytest.mark.parametrize("claim", ["A100", "a_b", "-a", "a-", "", "a" * 254, " a"])
def test_claim_names_must_be_dns1123(claim: str) -> None:
    with pytest.raises(InvalidPodClaims, match=r"must name a claim: a DNS-1123 name"):
        pod_claims.parse_pod_claims({f"{CLAIM}main": claim}, containers=["main"])


def test_unknown_container_names_the_containers_the_pod_has() -> None:
    with pytest.raises(InvalidPodClaims) as caught:
        pod_claims.parse_pod_claims({f"{CLAIM}mian": "c"}, containers=["main", "sidecar"])
    assert str(caught.value) == (
        f"metadata.annotations[{CLAIM}mian]: the pod has no container 'mian' (its containers: main, sidecar);"
        f" name one of its containers after '{CLAIM}'"
    )


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(InvalidPodClaims) as caught:
        pod_claims.parse_pod_claims(
            {f"{CLAIM}nope": "c", f"{INLINE}main": "gpu-core=150", f"{CLAIM}side": "c", f"{INLINE}side": "gpu=1"},
            containers=["main", "side"],
        )
    fields = [problem.field for problem in caught.value.problems]
    assert fields == [
        f"metadata.annotations[{CLAIM}nope]",
        f"metadata.annotations[{INLINE}main]",
        f"metadata.annotations[{INLINE}side]",  # side names a claim and asks inline: one of the two
    ]


def test_init_containers_may_use_claims() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {f"{CLAIM}sidecar": "c"}},
        "spec": {"initContainers": [{"name": "sidecar"}], "containers": [{"name": "main"}]},
    }
    assert pod_claims.read_pod_claims(pod).claims_by_container("p") == {"sidecar": "c"}


def test_no_annotations_is_no_claims() -> None:
    assert pod_claims.read_pod_claims({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]}}).is_empty
    assert not pod_claims.has_claim_annotations(None)
    assert pod_claims.has_claim_annotations({f"{INLINE}a": "gpu=1"})


@pytest.mark.parametrize(
    ("pod", "container"),
    [("web-1", "main"), ("a" * 58, "main"), ("a" * 253, "c" * 63), ("x." * 40 + "y", "main"), ("b" * 52 + ".c", "m")],
)
def test_inline_claim_names_fit_a_label_value_and_stay_stable(pod: str, container: str) -> None:
    name = pod_claims.inline_claim_name(pod, container)
    assert len(name) <= pod_claims.INLINE_CLAIM_NAME_MAX
    assert pod_claims.is_dns1123_subdomain(name)
    assert name == pod_claims.inline_claim_name(pod, container)
    if len(f"{pod}-{container}") <= 63:
        assert name == f"{pod}-{container}"


def test_long_names_sharing_a_beginning_get_different_claims() -> None:
    first = pod_claims.inline_claim_name("deployment-with-a-very-long-name-7d9f8c6b5-" + "x" * 30, "main")
    second = pod_claims.inline_claim_name("deployment-with-a-very-long-name-7d9f8c6b5-" + "y" * 30, "main")
    assert first != second
