"""Fixtures of the observability tests: the Prometheus binaries (or a skip naming why not)."""

from __future__ import annotations

import pytest

from tests.observability import prometheus


@pytest.fixture(scope="session")
def prometheus_binaries() -> prometheus.Binaries:
    found = prometheus.binaries()
    if isinstance(found, str):
        pytest.skip(found)
    return found
