"""Write a folder as a one-layer OCI image archive (image/build.sh's last step).

The archive is an OCI image layout in a tar (oci-layout, index.json, blobs/sha256/...), the format
`ctr -n k8s.io images import` takes on containerd 1.7 and 2.x (as testruntime/build.sh's busybox
image): the index's manifest carries the image's full name in `io.containerd.image.name` and its
tag in `org.opencontainers.image.ref.name`. Reproducible: the layer is GNU tar's, sorted, every
time 0, every owner root, gzip without name or time, so the same folder gives the same digests.

    python image/oci_archive.py --root DIR --name REPO:TAG --user 65532:65532 --out image.tar

The image's configuration is deploy/Containerfile's (tests/deploy/test_image.py keeps them in step):
Entrypoint ["elasticgpu"], Cmd ["--help"], the given User.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ENTRYPOINT = ["elasticgpu"]
CMD = ["--help"]
ENV = ["PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
CHUNK = 1 << 20


class ArchiveError(RuntimeError):
    """The layer could not be written (GNU tar or gzip failed); the message says which and why."""


def _digest_file(path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest(), path.stat().st_size


def _layer(root: Path, work: Path) -> tuple[Path, str]:
    """(the gzipped layer, the digest of its uncompressed tar: the config's diff_id)."""
    plain, packed = work / "layer.tar", work / "layer.tar.gz"
    # GNU tar, not Python's tarfile: it keeps hard links, device-free special modes and long names
    # exactly as dpkg unpacked them, and is several times faster on the ~300 MB tree.
    tar = subprocess.run(["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
                          "-C", str(root), "-cf", str(plain), "."], capture_output=True, text=True, timeout=600)
    if tar.returncode != 0:
        raise ArchiveError(f"tar of {root} failed: {tar.stderr.strip()}")
    diff_id, _ = _digest_file(plain)
    with packed.open("wb") as out:
        gz = subprocess.run(["gzip", "-n", "-6", "-c", str(plain)], stdout=out, stderr=subprocess.PIPE, timeout=600)
    if gz.returncode != 0:
        raise ArchiveError(f"gzip of the layer failed: {gz.stderr.decode(errors='replace').strip()}")
    plain.unlink()
    return packed, diff_id


def config(*, diff_id: str, user: str) -> dict[str, Any]:
    """The image configuration (OCI image-spec config.md) of the one layer."""
    return {
        "architecture": "amd64",
        "os": "linux",
        "config": {"User": user, "Env": ENV, "Entrypoint": ENTRYPOINT, "Cmd": CMD, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created_by": "elasticgpu image/build.sh"}],
    }


def write(*, root: Path, name: str, user: str, out: Path) -> None:
    """The archive of `root` named `name` (REPO:TAG), written to `out` (replaced whole)."""
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        work = Path(tmp)
        layer, diff_id = _layer(root, work)
        layer_digest, layer_size = _digest_file(layer)
        blobs: dict[str, bytes] = {}

        def blob(document: dict[str, Any]) -> dict[str, Any]:
            data = json.dumps(document, separators=(",", ":"), sort_keys=True).encode()
            digest = hashlib.sha256(data).hexdigest()
            blobs[digest] = data
            return {"digest": f"sha256:{digest}", "size": len(data)}

        config_ref = blob(config(diff_id=diff_id, user=user))
        manifest_ref = blob({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_ref},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": f"sha256:{layer_digest}", "size": layer_size}],
        })
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_ref,
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
            }],
        }
        partial = work / "image.tar"
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as archive:
            small = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": json.dumps(index).encode()}
            small.update({f"blobs/sha256/{d}": data for d, data in blobs.items()})
            for path, data in sorted(small.items()):
                info = tarfile.TarInfo(path)
                info.size, info.mode = len(data), 0o644
                archive.addfile(info, io.BytesIO(data))
            info = archive.gettarinfo(str(layer), arcname=f"blobs/sha256/{layer_digest}")
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = 0, 0, 0, "", "", 0o644
            with layer.open("rb") as f:
                archive.addfile(info, f)
        partial.replace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the folder that becomes the image's /")
    parser.add_argument("--name", required=True, help="the image's full name, REPO:TAG")
    parser.add_argument("--user", required=True, help="the config's User, UID:GID")
    parser.add_argument("--out", type=Path, required=True, help="the archive to write")
    args = parser.parse_args()
    write(root=args.root, name=args.name, user=args.user, out=args.out)


if __name__ == "__main__":
    main()
