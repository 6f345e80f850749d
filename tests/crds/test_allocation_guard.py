"""The GPU CRD itself refuses a status that oversubscribes the card: a second guard behind the
controller's resourceVersion precondition."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.crds.objects import Objects
from tests.factories import GPUFactory


def _allocation(name: str, cores: int, memory: int, exclusive: bool = False) -> dict[str, Any]:
    return {"elasticGPU": name, "cores": cores, "memory": memory, "exclusive": exclusive}


@pytest.fixture
def gpu(objects: Objects) -> Any:
    manifest = GPUFactory(spec__memory=16000).to_dict()
    objects.delete(manifest)
    objects.create(manifest)
    yield manifest
    objects.delete(manifest)


def test_allocations_within_capacity_are_stored(objects: Objects, gpu: dict[str, Any]) -> None:
    stored = objects.patch_status(gpu, {"allocations": [_allocation("a", 60, 8000), _allocation("b", 40, 8000)]})
    assert [a["elasticGPU"] for a in stored["status"]["allocations"]] == ["a", "b"]


@pytest.mark.parametrize(
    ("allocations", "message"),
    [
        ([_allocation("a", 60, 1000), _allocation("b", 50, 1000)], "cores of all reservations must not exceed 100"),
        ([_allocation("a", 10, 9000), _allocation("b", 10, 9000)], "memory of all reservations must not exceed"),
        ([_allocation("a", 100, 16000, True), _allocation("b", 0, 0)], "reserved whole (exclusive)"),
    ],
)
def test_oversubscription_is_refused(
    objects: Objects, gpu: dict[str, Any], allocations: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(client.ApiException) as caught:
        objects.patch_status(gpu, {"allocations": allocations})
    assert caught.value.status == 422
    assert message in caught.value.body
    assert not objects.get(gpu).get("status", {}).get("allocations")


def test_reservations_that_leave_out_exclusive_are_stored(objects: Objects, gpu: dict[str, Any]) -> None:
    # `exclusive` is optional (false when absent): the rule over it must not fail on its absence.
    shares = [{"elasticGPU": "a", "cores": 30, "memory": 1000}, {"elasticGPU": "b", "cores": 30, "memory": 1000}]
    stored = objects.patch_status(gpu, {"allocations": shares})
    assert [a["elasticGPU"] for a in stored["status"]["allocations"]] == ["a", "b"]
