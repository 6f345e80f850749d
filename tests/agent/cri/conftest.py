"""Fixtures of the CRI tests: a real containerd (tests/containerd_runtime.py) shared by the session.

The runtime is started once per session (about 0.3 s) and every pod a test made is removed
after the test, so tests see an empty runtime. If the runtime cannot run here (never built
because Debian's mirror was unreachable, or not root), the tests that need it skip with the
reason; once it is built, a failure to start it fails them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from tests.agent.cri.kubelet import Kubelet
from tests.containerd_runtime import RuntimeUnavailable, TestRuntime, remove_all_pods, running_containerd

UNAVAILABLE_ENV = "ELASTICGPU_TESTRUNTIME_UNAVAILABLE"
"""Set by scripts/test.sh to the reason when testruntime/build.sh failed: skip without retrying."""


@pytest.fixture(scope="session")
def containerd_session() -> Iterator[TestRuntime]:
    """A private containerd for the whole session (skips with the reason if it cannot run here)."""
    if reason := os.environ.get(UNAVAILABLE_ENV):
        pytest.skip(f"no test container runtime: {reason}")
    with contextlib.ExitStack() as stack:
        try:
            runtime = stack.enter_context(running_containerd())
        except RuntimeUnavailable as e:
            pytest.skip(f"no test container runtime: {e}")
        yield runtime


@pytest.fixture
def containerd(containerd_session: TestRuntime) -> Iterator[TestRuntime]:
    """The session's containerd, emptied of pods and CDI specs after the test."""
    yield containerd_session
    remove_all_pods(containerd_session)
    for spec in containerd_session.cdi_dir.iterdir():
        spec.unlink()


@pytest.fixture
def proxy_socket(containerd: TestRuntime) -> Path:
    """Where a test's CRI proxy listens (inside the runtime's temporary directory)."""
    return containerd.directory / f"proxy-{uuid.uuid4().hex[:8]}.sock"


@pytest.fixture
def passthrough_proxy(containerd: TestRuntime, proxy_socket: Path) -> Iterator[CriProxy]:
    """A CRI proxy with hooks that change nothing, in front of the test containerd."""
    with CriProxy(ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))) as proxy:
        yield proxy


@pytest.fixture
def kubelet(passthrough_proxy: CriProxy, containerd: TestRuntime) -> Iterator[Kubelet]:
    """A CRI client talking to the pass-through proxy, as kubelet would."""
    with Kubelet(f"unix://{passthrough_proxy.settings.listen}", containerd.image) as client:
        yield client
