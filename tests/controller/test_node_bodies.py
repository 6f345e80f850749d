"""What the picture keeps of a Node (issue 49 item 2: the controller at 5,000 nodes within 1 GiB).

A Node's managedFields (the kubelet's status writes) are a large part of its body and nothing
reads them: the picture keeps a Node without them, from a watch event and from a list alike. Its
labels (the classes' nodeSelectors) are kept as the picture's own strings, none of the list's
(`compact.own`: one kept string of a parsed list keeps an arena of it).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from elasticgpu.controller.picture.picture import Picture

pytestmark = pytest.mark.timeout(30)


def _node(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version,
                         "labels": {"gpu.example.com/pool": "a100"},
                         "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:images": {}}}}]},
            "spec": {}, "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}}}


def test_a_watched_node_is_kept_without_managed_fields() -> None:
    picture = Picture()
    body = _node("node-1", "10")
    picture.observe("node", "ADDED", body)
    kept = picture.pods.nodes()["node-1"]
    assert "managedFields" not in kept["metadata"]
    assert kept["status"] == body["status"] and kept["metadata"]["labels"] == body["metadata"]["labels"]
    assert "managedFields" in body["metadata"], "the caller's body is not changed"


def test_a_listed_node_is_kept_without_managed_fields_and_its_labels_are_the_pictures() -> None:
    picture = Picture()
    body = orjson.loads(orjson.dumps(_node("node-2", "11")))  # strings of a parsed list, not this file's
    picture.merge_cards(nodes=[body], gpus=[], gpus_version="11", classes=[])
    assert "managedFields" not in picture.pods.nodes()["node-2"]["metadata"]
    labels = picture.ledger.node_labels("node-2")
    assert labels == body["metadata"]["labels"]
    ((key, value),) = labels.items()
    ((listed_key, listed_value),) = body["metadata"]["labels"].items()
    assert key is not listed_key and value is not listed_value
