"""elasticgpu: claim GPUs in Kubernetes the way you claim storage."""

__version__ = "0.1.0"
