"""The CRI-facing hook: a proxy between kubelet and the container runtime that injects claimed GPUs."""
