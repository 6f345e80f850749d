"""The NVML side of MigControl where it can be checked without a GPU: every NVML name it uses exists in
nvidia-ml-py, NVML's errors (its real NVMLError classes) become the agent's MIG errors, and the
nvidia-caps minors of an instance are read from the driver's mig-minors file. On a card in MIG mode,
`elasticgpu agent run --backend nvml` and a MIG claim are the real check (not run: no GPU here)."""

from __future__ import annotations

import re
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest

from elasticgpu.agent import errors
from elasticgpu.agent.discovery import nvml, nvml_mig
from elasticgpu.agent.discovery.mig import MigControl

SOURCE = Path(nvml_mig.__file__).read_text()


def test_every_nvml_name_it_uses_exists_in_nvidia_ml_py() -> None:
    used = set(re.findall(r"\bnvml\.((?:nvml|NVML|c_nvml)\w+)", SOURCE))
    used |= {f"NVML_GPU_INSTANCE_PROFILE_{kind}" for kind in nvml_mig._GI_PROFILES}
    used |= {f"NVML_COMPUTE_INSTANCE_PROFILE_{kind}" for kind in nvml_mig._CI_PROFILES.values()}
    assert len(used) > 25
    assert sorted(name for name in used if not hasattr(pynvml, name)) == []


def test_the_nvml_backend_is_a_mig_control() -> None:
    assert issubclass(nvml.NvmlBackend, MigControl)  # so the agent installs its MIG hooks on it


@pytest.mark.parametrize(("code", "kind", "hint"), [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, errors.MigNotEnabled, "not in MIG mode"),
    (pynvml.NVML_ERROR_INVALID_ARGUMENT, errors.MigInvalidPlacement, ""),
    (pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES, errors.MigInsufficientResources, ""),
    (pynvml.NVML_ERROR_IN_USE, errors.MigInUse, "stop them first"),
    (pynvml.NVML_ERROR_NOT_FOUND, errors.MigNotFound, ""),
    (pynvml.NVML_ERROR_NO_PERMISSION, errors.MigError, "CAP_SYS_ADMIN"),
    (pynvml.NVML_ERROR_UNKNOWN, errors.MigError, ""),
])  # fmt: skip
def test_nvml_errors_become_the_agents_mig_errors(code: int, kind: type[errors.MigError], hint: str) -> None:
    translated = nvml_mig.mig_error(pynvml.NVMLError(code), "card GPU-1: creating 3g.40gb at slice 4", pynvml)
    assert type(translated) is kind
    assert str(translated).startswith("card GPU-1: creating 3g.40gb at slice 4: NVML: ") and hint in str(translated)


def test_an_instances_access_devices_come_from_the_mig_minors_file() -> None:
    minors = nvml_mig.mig_minors("config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n"
                                 "gpu1/gi1/access 150\nnot a line\n")  # fmt: skip
    assert nvml_mig.access_paths(minors, card_minor=0, gpu_instance_id=1, compute_instance_id=0) == (
        "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13")
    assert nvml_mig.access_paths(minors, card_minor=0, gpu_instance_id=2, compute_instance_id=0) == ()
