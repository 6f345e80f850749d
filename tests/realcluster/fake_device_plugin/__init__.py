"""A test double of NVIDIA's device plugin (k8s-device-plugin) for the real-cluster tier: a gRPC server on a unix
socket in kubelet's device-plugin folder that registers `nvidia.com/gpu` with kubelet (device plugin API v1beta1,
the vendored `api.proto`) and hands out the cards it is given. Run as its own process:
`python -m tests.realcluster.fake_device_plugin --dir DIR --ids GPU-a,GPU-b` (serving.py)."""
