"""The quota tests use the binding tests' fixtures (API server, cluster objects, controllers)."""

from tests.binding.conftest import cluster, kube  # noqa: F401  # fixtures, re-exported for pytest
