"""The GPU check of the isolation modes (scripts/gpu_check/isolation_check.py), its CPU-only parts: the
command line, the environment of each mode, the verdict and the report; and that it needs nothing but
the standard library (it runs with the system's Python on a lent machine)."""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/gpu_check/isolation_check.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("isolation_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["isolation_check"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


check = load()


def test_only_the_standard_library() -> None:
    tree = ast.parse(SCRIPT.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_command_line() -> None:
    args = check.parse(["run"])
    assert (args.modes, args.memory_mib, args.cores, args.chunk_mib) == (["none", "mps", "hami"], 10240, 30, 256)
    args = check.parse(["run", "--modes", "mps, hami", "--memory-mib", "4096", "--cores", "25"])
    assert (args.modes, args.memory_mib, args.cores) == (["mps", "hami"], 4096, 25)
    assert check.parse(["ceiling", "--chunk-mib", "64"]).chunk_mib == 64


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "--modes", "mig"], "--modes: mig"),
    (["run", "--cores", "0"], "--cores: must be 1..100"),
    (["run", "--memory-mib", "0"], "--memory-mib: must be at least 1"),
])
def test_bad_values_name_the_flag(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        check.parse(argv)
    assert exited.value.code == 2 and says in capsys.readouterr().err


def test_each_mode_s_environment_is_the_agent_s() -> None:
    mps = check.child_env("mps", uuid="GPU-1", memory_mib=10240, cores=30, pipe_dir="/p")
    assert (mps["CUDA_VISIBLE_DEVICES"], mps["CUDA_MPS_PIPE_DIRECTORY"], mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == ("GPU-1", "/p", "0=10240M", "30")
    hami = check.child_env("hami", uuid="GPU-1", memory_mib=4096, cores=25, library="/l/libvgpu.so", cache="/c")
    assert (hami["LD_PRELOAD"], hami["CUDA_DEVICE_MEMORY_LIMIT_0"], hami["CUDA_DEVICE_SM_LIMIT"],
            hami["CUDA_DEVICE_MEMORY_SHARED_CACHE"]) == ("/l/libvgpu.so", "4096m", "25", "/c")
    none = check.child_env("none", uuid="GPU-1", memory_mib=4096, cores=25)
    assert not any(k.startswith(("CUDA_MPS_", "CUDA_DEVICE_")) for k in none) and "LD_PRELOAD" not in mps


def test_the_verdict_against_the_slice() -> None:
    # a 10 GiB MPS slice on an 80 GiB card that stops at about 10 GiB is enforced; at 70 GiB it is not
    assert check.verdict("mps", 10240, 10240, 256) == "ENFORCED"
    assert check.verdict("mps", 10240, 10240 + 256 + 512, 256) == "ENFORCED"  # a chunk and 5% of tolerance
    assert check.verdict("hami", 10240, 71680, 256) == "NOT ENFORCED"
    assert check.verdict("none", 10240, 79000, 256) == "ADVISORY"
    assert check.verdict("mps", 10240, None, 256) == "FAILED"


def test_the_report_and_the_exit_code() -> None:
    args = check.parse(["run", "--modes", "none,mps,hami"])
    outcomes = [check.Outcome("none", 10240, 79000, "CUDA_ERROR_OUT_OF_MEMORY (2)", "ADVISORY"),
                check.Outcome("mps", 10240, 10240, "CUDA_ERROR_OUT_OF_MEMORY (2)", "ENFORCED"),
                check.Outcome("hami", 10240, None, "", "SKIPPED", "no --hami-core-library file")]
    card = {"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "memory_mib": 143771, "mig": False}
    text = check.render({"driver": "570.1", "cards": [card]}, card, outcomes, args)
    assert "driver 570.1, 1 card(s); checked card 0 GPU-1 NVIDIA H200 (143771 MiB, MIG False)" in text
    assert "slice: 10240 MiB, 30% cores" in text
    lines = text.splitlines()
    assert lines[3].split()[:4] == ["none", "79000", "10240", "ADVISORY"]
    assert lines[4].split()[:4] == ["mps", "10240", "10240", "ENFORCED"]
    assert "SKIPPED" in lines[5] and "no --hami-core-library file" in lines[5]
    assert check.exit_code(outcomes) == 0
    assert check.exit_code([*outcomes, check.Outcome("hami", 10240, 70000, "", "NOT ENFORCED")]) == 1


def test_without_a_driver_it_says_so_and_exits_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "discover"], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/nonexistent"})
    if done.returncode == 0:
        pytest.skip("this machine has an NVIDIA driver: the check runs for real here")
    assert done.returncode == 2 and "no NVIDIA driver here" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and util-linux's unshare")
def test_the_mps_daemon_and_its_client_share_one_dev_shm_as_the_agent_runs_them(tmp_path: Path) -> None:
    """with_shm runs a command as the agent runs a card's MPS daemon (and, with `container`, as a container of the
    card): what one writes into its /dev/shm the other reads; the host's /dev/shm is untouched."""
    shm = tmp_path / "shm"
    shm.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "isolation-check-test", str(shm)], check=True)
    try:
        name = f"isolation-check-{os.getpid()}"
        subprocess.run(check.with_shm(["sh", "-c", f"echo daemon > /dev/shm/{name}"], str(shm)), check=True)
        read = subprocess.run(check.with_shm(["cat", f"/dev/shm/{name}"], str(shm), container=True),
                              capture_output=True, text=True, check=True)
        assert read.stdout == "daemon\n" and (shm / name).read_text() == "daemon\n"
        assert not Path("/dev/shm", name).exists()
    finally:
        subprocess.run(["umount", "-l", str(shm)], check=False)
