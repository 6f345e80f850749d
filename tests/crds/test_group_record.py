"""The claim group attempt record on a reservation (`status.allocations[].group`,
docs/gangs.md): stored as written, and the API server refuses a malformed one naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from elasticgpu.api import GPU
from tests.crds.objects import Objects
from tests.factories import GPUFactory

RECORD = {"token": "4be1", "anchor": "worker-0", "anchorGPU": "gpu-0", "state": "Committing"}


@pytest.fixture
def gpu(objects: Objects) -> Any:
    manifest = GPUFactory(spec__memory=16000).to_dict()
    objects.delete(manifest)
    objects.create(manifest)
    yield manifest
    objects.delete(manifest)


def _reservation(group: dict[str, Any]) -> dict[str, Any]:
    return {"elasticGPU": "egpu-a", "cores": 100, "memory": 16000, "exclusive": True, "group": group}


def test_a_group_record_is_stored_and_read_back(objects: Objects, gpu: dict[str, Any]) -> None:
    stored = objects.patch_status(gpu, {"allocations": [_reservation(RECORD)]})
    assert stored["status"]["allocations"][0]["group"] == RECORD
    record = GPU.model_validate(stored).status.allocations[0].group
    assert record is not None and (record.anchor_gpu, record.state) == ("gpu-0", "Committing")


@pytest.mark.parametrize(("change", "field"), [
    ({"state": "Done"}, "state"),
    ({"token": ""}, "token"),
    ({"anchorGPU": None}, "anchorGPU"),
])
def test_a_malformed_group_record_is_refused_naming_the_field(
        objects: Objects, gpu: dict[str, Any], change: dict[str, Any], field: str) -> None:
    group = {k: v for k, v in {**RECORD, **change}.items() if v is not None}
    with pytest.raises(client.ApiException) as caught:
        objects.patch_status(gpu, {"allocations": [_reservation(group)]})
    assert caught.value.status == 422, caught.value.body
    assert f"group.{field}" in caught.value.body, caught.value.body
