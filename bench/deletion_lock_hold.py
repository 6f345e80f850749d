"""How long the deletions a fresh list implies hold the picture's lock, at 50,000 claims (task delrace).

A watch's start over and the periodic relist by metadata compare a list with the picture and take in
as DELETED what the list lacks. Every watch thread and the worker wait while the lock is held, so its
longest hold is the figure. In one run, on one picture of `--claims` claims (`--gone` of them missing
from the list), each `--rounds` times, the longest outermost hold of:

  old unlisted      the lock around `held_versions` and `as_deleted` (the code before: a Python loop
                    over every claim under the lock);
  unlisted          `Picture.unlisted` now: a copy of the keys, then the few the list lacks;
  old held_versions what the relist compares the list with (every claim's resourceVersion and uid),
                    read in one hold as before;
  held_versions     the same now: `HELD_CHUNK` claims per hold;
  deletion          one `Picture.observe_if_held` (check and delete in one hold).

No API server: the picture alone, driven as the informer drives it.

    nice python bench/deletion_lock_hold.py --claims 50000 --gone 10 --rounds 5
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticgpu.controller.picture import versions  # noqa: E402
from elasticgpu.controller.picture.picture import Picture  # noqa: E402
from tests.binding import objects as o  # noqa: E402
from tests.controller.release_points import ReleasePoints, probed  # noqa: E402

Body = dict[str, Any]


def _picture(claims: int) -> tuple[Picture, list[Body]]:
    bodies = []
    for index in range(claims):
        body = o.claim(f"claim-{index}", f"ns-{index % 50}", uid=str(uuid.uuid4()))
        body["metadata"]["resourceVersion"] = str(1000 + index)
        bodies.append(body)
    picture = Picture()
    picture.merge_claim_list(bodies, str(1000 + claims))
    return picture, bodies


def _longest_s(picture: Picture, call: Callable[[], object], took: list[float]) -> float:
    """The longest outermost hold of the lock during `call()`; its wall time appended to `took`."""
    probe = ReleasePoints(picture.lock, at=0, land=lambda: None)
    started = time.perf_counter()
    probed(picture, probe, call)
    took.append(time.perf_counter() - started)
    return probe.longest_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claims", type=int, default=50_000)
    parser.add_argument("--gone", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    picture, bodies = _picture(args.claims)
    print(f"picture of {args.claims} claims built in {time.perf_counter() - started:.1f} s")
    list_version = str(10**9)
    listed = [{"metadata": b["metadata"]} for b in bodies[args.gone:]]  # metadata only, as the relist lists
    names = {(m["metadata"]["namespace"], m["metadata"]["name"]) for m in listed}

    def old_unlisted() -> object:
        with picture.lock:  # the body of `Picture.unlisted` before
            held = picture.as_deleted("claim", set(picture.held_versions("claim")) - names)
        return [body for body in held if not versions.changed_after(body, list_version)]

    def old_held_versions() -> object:
        with picture.lock:  # one hold around the whole read, as before
            return picture.held_versions("claim")

    names_of = ("old unlisted", "unlisted", "old held_versions", "held_versions", "deletion")
    figures: dict[str, list[float]] = {name: [] for name in names_of}
    took: dict[str, list[float]] = {name: [] for name in names_of}
    calls: dict[str, Callable[[], object]] = {
        "old unlisted": old_unlisted, "unlisted": lambda: picture.unlisted("claim", listed, list_version),
        "old held_versions": old_held_versions, "held_versions": lambda: picture.held_versions("claim")}
    for _ in range(args.rounds):
        for name, call in calls.items():
            figures[name].append(_longest_s(picture, call, took[name]))
    gone = picture.unlisted("claim", listed, list_version)
    assert len(gone) == args.gone, len(gone)
    for one in gone:
        figures["deletion"].append(_longest_s(picture, lambda one=one: picture.observe_if_held(  # type: ignore[misc]
            "claim", "DELETED", versions.deleted_at(one.body, list_version), one.held), took["deletion"]))
    assert not picture.unlisted("claim", listed, list_version)
    old = min(figures["old unlisted"])
    for name, held in figures.items():
        print(f"{name:17s} longest hold: min {min(held) * 1e3:8.3f} ms, max {max(held) * 1e3:8.3f} ms"
              f" ({min(held) / old:.4f}x old unlisted, min/min); whole call min {min(took[name]) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
