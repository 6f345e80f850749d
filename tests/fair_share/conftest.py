"""The fair-share tests against the API server reuse the binding tests' fixtures (KubeApi, per-test objects)."""

from tests.binding.conftest import cluster, kube

__all__ = ["cluster", "kube"]
