"""Where the product image built without a registry is: image/build.sh's OCI archive and its name
(what `elasticgpu demo --cluster real --install chart` imports into the box's node, as the tests do:
tests/product_image.py re-exports this module).

``find_image()`` reads ELASTICGPU_IMAGE_ARCHIVE and ELASTICGPU_IMAGE_NAME from the environment
(scripts/test.sh exports what image/build.sh printed) or else from ``<cache>/image/current.env``, and
runs image/build.sh once when nothing was built yet. When the image cannot be had (scripts/test.sh set
ELASTICGPU_IMAGE_UNAVAILABLE because the build failed with nothing cached, or the build fails here) it
raises ``ImageUnavailable`` with the reason (the tests skip with it, the demo says it). ``import_image()`` puts it
into a containerd the way a node gets it without a registry: ``ctr -n k8s.io images import``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from elasticgpu.testbed.local_cluster import read_env_file
from elasticgpu.testbed.local_runtime import ctr_import

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "image" / "build.sh"
UNAVAILABLE_ENV = "ELASTICGPU_IMAGE_UNAVAILABLE"
"""Set by scripts/test.sh to the reason when image/build.sh failed with nothing cached."""
BUILD_TIMEOUT_S = 900
"""A cold build: ~60 Debian packages and ~50 wheels fetched, the bytecode compiled (~4 min on 2 busy cores)."""
IMPORT_TIMEOUT_S = 300
"""`ctr images import` unpacks the ~110 MB layer (~440 MB) into the snapshotter."""


class ImageUnavailable(RuntimeError):
    """The product image was not built and cannot be built here; the tests that need it skip."""


@dataclass(frozen=True)
class ProductImage:
    archive: Path  # the OCI image archive (`ctr -n k8s.io images import` takes it)
    name: str  # the name it holds: the chart's default image (values.yaml image.repository:appVersion)


def cache_dir() -> Path:
    """Where image/build.sh keeps its builds and current.env."""
    return Path(os.environ.get("ELASTICGPU_CACHE", Path.home() / ".cache" / "elasticgpu")) / "image"


def _read() -> ProductImage | None:
    """scripts/test.sh exports what image/build.sh printed for this checkout; else the cache's current.env
    (last written by whichever checkout sharing the cache built last)."""
    if os.environ.get("ELASTICGPU_IMAGE_ARCHIVE"):
        values = dict(os.environ)
    else:
        env_file = cache_dir() / "current.env"
        values = read_env_file(env_file) if env_file.exists() else {}
    archive, name = values.get("ELASTICGPU_IMAGE_ARCHIVE", ""), values.get("ELASTICGPU_IMAGE_NAME", "")
    if archive and name and os.path.isfile(archive):
        return ProductImage(Path(archive), name)
    return None


def find_image(*, build_if_missing: bool = True) -> ProductImage:
    """The newest build of the product image (runs image/build.sh once when none is there)."""
    if reason := os.environ.get(UNAVAILABLE_ENV):
        raise ImageUnavailable(reason)
    if (found := _read()) is not None:
        return found
    if not build_if_missing:
        raise ImageUnavailable(f"the product image was not built; run `bash {BUILD_SCRIPT}`")
    print(f"product_image: no cached product image; running {BUILD_SCRIPT}", file=sys.stderr)
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise ImageUnavailable(f"image/build.sh ran past {BUILD_TIMEOUT_S} s") from e
    if done.returncode != 0:
        raise ImageUnavailable(f"image/build.sh failed: {done.stderr.decode(errors='replace')[-500:]}")
    if (found := _read()) is None:
        raise ImageUnavailable(f"image/build.sh succeeded but {cache_dir() / 'current.env'} names no archive")
    return found


def this_checkouts_image() -> ProductImage:
    """The image of this checkout's code: scripts/test.sh's export when given (it ran image/build.sh for
    this checkout already), else image/build.sh's answer (a cache hit takes ~2 s, a build minutes). The
    cache's current.env alone is not enough here: it names whichever checkout sharing the cache built last."""
    if reason := os.environ.get(UNAVAILABLE_ENV):
        raise ImageUnavailable(reason)
    if os.environ.get("ELASTICGPU_IMAGE_ARCHIVE") and (found := _read()) is not None:
        return found
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise ImageUnavailable(f"image/build.sh ran past {BUILD_TIMEOUT_S} s") from e
    if done.returncode != 0:
        raise ImageUnavailable(f"image/build.sh failed: {done.stderr[-500:]}")
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    archive, name = values.get("ELASTICGPU_IMAGE_ARCHIVE", ""), values.get("ELASTICGPU_IMAGE_NAME", "")
    if not (archive and name and os.path.isfile(archive)):
        raise ImageUnavailable(f"image/build.sh succeeded but named no archive: {done.stdout[-300:]}")
    return ProductImage(Path(archive), name)


def import_image(image: ProductImage, *, ctr: Path, address: Path) -> None:
    """`ctr -n k8s.io images import` of the archive into the containerd at `address` (its socket):
    what an administrator does on a node with no registry; kubelet then finds the chart's image there."""
    if (error := ctr_import(ctr, address, image.archive, timeout_s=IMPORT_TIMEOUT_S)) is not None:
        raise RuntimeError(f"ctr images import of {image.archive} failed: {error}")
