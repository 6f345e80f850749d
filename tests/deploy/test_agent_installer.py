"""The agent installer's program (the ConfigMap of deploy/agent-installer.yaml), run against a scratch
node: it puts the image's files, the unit and agent.env in place, asks systemd to reload and restart
only for a change, starts the agent once its kubeconfig is there, never touches kubelet, and the
Python it installs runs through the image's own loader.

systemctl is a recording stand-in (no systemd here); the "image" is a tree of links into this
machine's Debian Python, which is what the real image (python:3.11-slim-bookworm) holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
UNIT = "elasticgpu-agent.service"
MPS_UNIT = "elasticgpu-mps.service"


def _installer_files(tmp_path: Path) -> Path:
    """The ConfigMap's keys as files, as the pod mounts them at /installer."""
    docs = yaml.safe_load_all((REPO / "deploy" / "agent-installer.yaml").read_text())
    (config,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    files = tmp_path / "installer"
    files.mkdir()
    for key, text in config["data"].items():
        (files / key).write_text(text)
    return files


def _image(root: Path, record: str) -> Path:
    """An image root: Debian's python3.11 and its loader and libraries (linked), elasticgpu's RECORD."""
    (root / "usr" / "local" / "bin").mkdir(parents=True)
    (root / "usr" / "local" / "bin" / "python3").symlink_to("/usr/bin/python3.11")
    stdlib = root / "usr" / "local" / "lib" / "python3.11"
    stdlib.mkdir(parents=True)
    for entry in Path("/usr/lib/python3.11").iterdir():
        if entry.name != "site-packages":
            (stdlib / entry.name).symlink_to(entry)
    info = stdlib / "site-packages" / "elasticgpu-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "RECORD").write_text(record)
    (root / "usr" / "lib").mkdir()
    (root / "usr" / "lib" / "x86_64-linux-gnu").symlink_to("/usr/lib/x86_64-linux-gnu")
    (root / "lib64").mkdir()
    (root / "lib64" / "ld-linux-x86-64.so.2").symlink_to("/lib64/ld-linux-x86-64.so.2")
    return root


class Node:
    """A scratch node: its / , a recording systemctl, and the installer's environment."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "host"
        self.root.mkdir()
        self.calls = tmp_path / "systemctl-calls"
        self.calls.touch()
        systemctl = tmp_path / "systemctl"
        systemctl.write_text(f'#!/bin/sh\necho "$*" >> {self.calls}\n')
        systemctl.chmod(0o755)
        self.files = _installer_files(tmp_path)
        self.image = _image(tmp_path / "image", "elasticgpu/__init__.py,sha256=one,10\n")
        self.env = {
            "PATH": "/usr/bin:/bin",
            "ELASTICGPU_HOST_ROOT": str(self.root),
            "ELASTICGPU_IMAGE_ROOT": str(self.image),
            "ELASTICGPU_INSTALLER_FILES": str(self.files),
            "ELASTICGPU_IMAGE_TAG": "0.1.0",
            "ELASTICGPU_NODE_NAME": "gpu-node-1",
            "ELASTICGPU_SYSTEMCTL": str(systemctl),
            "ELASTICGPU_INSTALLER_ONCE": "1",
        }

    def install(self) -> list[str]:
        """Runs the installer once; the systemctl calls it made."""
        self.calls.write_text("")
        done = subprocess.run(
            ["sh", str(self.files / "install-agent.sh")], env=self.env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return self.calls.read_text().splitlines()


@pytest.mark.skipif(
    not Path("/usr/lib/python3.11/os.py").exists() or not Path("/lib64/ld-linux-x86-64.so.2").exists(),
    reason="needs Debian's python3.11 on x86-64 (the image's own Python)",
)
def test_installs_restarts_only_for_a_change_and_never_kubelet(tmp_path: Path) -> None:
    node = Node(tmp_path)
    # No kubeconfig yet: installed and enabled, not started.
    assert node.install() == ["daemon-reload", f"enable {MPS_UNIT} {UNIT}"]
    # Both units as they are in deploy/: the agent's, and the MPS daemons' it Wants= (their own cgroup).
    for name in (UNIT, MPS_UNIT):
        unit = node.root / "etc" / "systemd" / "system" / name
        assert unit.read_text() == (REPO / "deploy" / name).read_text()
    env = (node.root / "etc" / "elasticgpu" / "agent.env").read_text()
    assert "ELASTICGPU_AGENT_NODE_NAME=gpu-node-1\n" in env
    opt = node.root / "opt" / "elasticgpu"
    (release,) = [p.name for p in (opt / "releases").iterdir()]
    assert release.startswith("0.1.0-") and os.readlink(opt / "current") == f"releases/{release}"
    # The Python it installed runs, from the image's files, through the image's loader (the unit's
    # ExecStart is /opt/elasticgpu/bin/python; here /opt is under the scratch root).
    wrapper = (opt / "bin" / "python").read_text().replace("/opt/elasticgpu", str(opt))
    ran = subprocess.run(
        ["sh", "-c", wrapper, "python", "-c", "import sys, ssl, json; print(sys.prefix)"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(opt / "current" / "root" / "usr" / "local")

    # The kubeconfig appears: started (not restarted: nothing changed since).
    (node.root / "etc" / "elasticgpu" / "kubeconfig").write_text("apiVersion: v1\n")
    assert node.install() == [f"enable {MPS_UNIT} {UNIT}", f"start {MPS_UNIT}", f"start {UNIT}"]
    # A new unit and a new image: reload and restart (the MPS service first: its restart leaves its
    # daemons running, KillMode=process); the previous release stays, older ones go.
    (node.files / UNIT).write_text((node.files / UNIT).read_text() + "# changed\n")
    record = next(node.image.glob("usr/local/lib/python3.11/site-packages/*.dist-info/RECORD"))
    record.write_text("elasticgpu/__init__.py,sha256=two,10\n")
    calls = node.install()
    assert calls == ["daemon-reload", f"enable {MPS_UNIT} {UNIT}", f"restart {MPS_UNIT}", f"restart {UNIT}"]
    # A new MPS unit alone is reloaded and installed too.
    (node.files / MPS_UNIT).write_text((node.files / MPS_UNIT).read_text() + "# changed\n")
    calls = node.install()
    assert calls == ["daemon-reload", f"enable {MPS_UNIT} {UNIT}", f"restart {MPS_UNIT}", f"restart {UNIT}"]
    assert (node.root / "etc" / "systemd" / "system" / MPS_UNIT).read_text().endswith("# changed\n")
    record.write_text("elasticgpu/__init__.py,sha256=three,10\n")
    node.install()
    assert len(list((opt / "releases").iterdir())) == 2 and release not in os.listdir(opt / "releases")
    assert not [c for c in node.calls.read_text().splitlines() if "kubelet" in c]


@pytest.mark.skipif(
    not Path("/usr/lib/python3.11/os.py").exists() or not Path("/lib64/ld-linux-x86-64.so.2").exists(),
    reason="needs Debian's python3.11 on x86-64 (the image's own Python)",
)
def test_the_sleeping_installer_starts_the_agent_when_its_kubeconfig_arrives(tmp_path: Path) -> None:
    node = Node(tmp_path)
    env = {**node.env, "ELASTICGPU_INSTALLER_ONCE": "", "ELASTICGPU_INSTALLER_POLL_S": "0.1"}
    process = subprocess.Popen(
        ["sh", str(node.files / "install-agent.sh")], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 60
        while f"enable {MPS_UNIT} {UNIT}" not in node.calls.read_text():
            assert process.poll() is None and time.monotonic() < deadline, "the installer did not install"
            time.sleep(0.05)
        (node.root / "etc" / "elasticgpu" / "kubeconfig").write_text("apiVersion: v1\n")
        while f"restart {UNIT}" not in node.calls.read_text():
            assert process.poll() is None and time.monotonic() < deadline, "the agent was not started"
            time.sleep(0.05)
        # The MPS service is (re)started before the agent, which asks it for daemons once it serves.
        calls = node.calls.read_text().splitlines()
        assert calls.index(f"restart {MPS_UNIT}") < calls.index(f"restart {UNIT}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
