"""Reading an ElasticGPUClass's parameters."""

from __future__ import annotations

import pytest

from elasticgpu.api import InvalidClassParameters, parse_class_parameters


def test_defaults() -> None:
    parsed = parse_class_parameters({})
    assert (parsed.policy, parsed.gpu_model, parsed.node_selector, parsed.sharing) == (
        "fragmentation",
        (),
        {},
        "timeslice",
    )


def test_all_parameters() -> None:
    parsed = parse_class_parameters(
        {"policy": "binpack", "gpuModel": "A100*| H100*", "nodeSelector": "pool=gpu, zone=a", "sharing": "mps"}
    )
    assert parsed.policy == "binpack"
    assert parsed.gpu_model == ("A100*", "H100*")
    assert parsed.node_selector == {"pool": "gpu", "zone": "a"}
    assert parsed.sharing == "mps"


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ({"color": "green"}, "ElasticGPUClass fast: parameters.color"),
        ({"policy": "greedy"}, "ElasticGPUClass fast: parameters.policy"),
        ({"sharing": "always"}, "ElasticGPUClass fast: parameters.sharing"),
        ({"nodeSelector": "pool"}, "ElasticGPUClass fast: parameters.nodeSelector"),
    ],
)
def test_bad_parameters_name_class_and_key(parameters: dict[str, str], field: str) -> None:
    with pytest.raises(InvalidClassParameters) as caught:
        parse_class_parameters(parameters, class_name="fast")
    assert caught.value.field == field
