"""Fixtures for the tests of the CRDs against a real API server."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.crds.objects import Objects


@pytest.fixture
def objects(api_client: client.ApiClient, crds_installed: object, namespace: str) -> Objects:
    """Objects helper bound to a fresh namespace, with the CRDs installed."""
    return Objects(api_client, namespace)
