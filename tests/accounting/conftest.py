"""The accounting tests against the API server reuse the binding tests' fixtures."""

from tests.binding.conftest import cluster, kube  # noqa: F401  (fixtures)
