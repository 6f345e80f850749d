"""Variants of the test runtime's busybox image, made from its OCI archive and imported by `ctr`.

A CUDA image (nvidia/cuda:*) sets `NVIDIA_VISIBLE_DEVICES=all` in its config; the tests need
such an image without pulling one. The variant reuses the busybox layer unchanged and only
writes a new config (its `Env`), manifest and index, so it costs a few KiB and no rebuild of
the cached runtime (testruntime/build.sh stays as it is, and so does its cache key).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from elasticgpu.testbed.local_runtime import ctr_import
from tests.containerd_runtime import TestRuntime, find_build

CUDA_LIKE_IMAGE = "elasticgpu.local/busybox-cuda:test"
"""The busybox image with the environment of NVIDIA's CUDA images (NVIDIA_VISIBLE_DEVICES=all)."""
CUDA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def variant_archive(source: Path, *, name: str, env: dict[str, str]) -> bytes:
    """An OCI image archive of `source`'s image under `name`, its config's Env extended by `env`."""
    with tarfile.open(source) as archive:
        members = {m.name.removeprefix("./"): archive.extractfile(m) for m in archive.getmembers() if m.isfile()}
        files = {path: handle.read() for path, handle in members.items() if handle is not None}
    index = json.loads(files["index.json"])
    manifest_digest = index["manifests"][0]["digest"]
    manifest: dict[str, Any] = json.loads(files["blobs/sha256/" + manifest_digest.split(":", 1)[1]])
    config: dict[str, Any] = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":", 1)[1]])
    config["config"]["Env"] = list(config["config"].get("Env") or []) + [f"{k}={v}" for k, v in env.items()]
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest["config"] = {**manifest["config"], "digest": config_digest, "size": len(config_bytes)}
    new_manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index["manifests"] = [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": new_manifest_digest,
        "size": len(manifest_bytes),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
    }]
    files["index.json"] = json.dumps(index).encode()
    files["blobs/sha256/" + config_digest.split(":", 1)[1]] = config_bytes
    files["blobs/sha256/" + new_manifest_digest.split(":", 1)[1]] = manifest_bytes
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def import_variant(runtime: TestRuntime, *, name: str = CUDA_LIKE_IMAGE, env: dict[str, str] | None = None) -> str:
    """Import the busybox image with `env` added (default: a CUDA image's) as `name`; returns the name."""
    build = find_build(build_if_missing=False)
    archive = runtime.directory / f"variant-{hashlib.sha256(name.encode()).hexdigest()[:8]}.tar"
    archive.write_bytes(variant_archive(Path(build["ELASTICGPU_TESTRUNTIME_IMAGE"]), name=name,
                                        env=CUDA_ENV if env is None else env))
    root = Path(build["ELASTICGPU_TESTRUNTIME_ROOT"])
    error = ctr_import(runtime.ctr, runtime.socket, archive,
                       env={**os.environ, "PATH": f"{root}/usr/bin:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    if error is not None:
        raise RuntimeError(f"ctr images import of {name} failed: {error}")
    return name
