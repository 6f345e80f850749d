"""The reads a list is compared with let go of the picture's lock between chunks: every watch thread
and the worker wait while it is held, and at 50,000 claims one read of every claim held it 0.12-0.33 s
(`bench/deletion_lock_hold.py`). Counted as the moments another thread could take the lock
(`release_points`), on a picture alone: the timing itself is the bench's, too noisy for a test.
"""

from __future__ import annotations

import pytest

from elasticgpu.controller.picture.picture import HELD_CHUNK, Picture
from tests.binding import objects as o
from tests.controller.release_points import ReleasePoints, probed

pytestmark = pytest.mark.timeout(120)
CLAIMS = 2 * HELD_CHUNK + 500


@pytest.fixture(scope="module")
def picture() -> Picture:
    bodies = []
    for index in range(CLAIMS):
        body = o.claim(f"claim-{index}", f"ns-{index % 7}")
        body["metadata"]["resourceVersion"] = str(1000 + index)
        bodies.append(body)
    held = Picture()
    held.merge_claim_list(bodies, str(1000 + CLAIMS))
    return held


def _releases(picture: Picture, call: object) -> int:
    probe = ReleasePoints(picture.lock, at=0, land=lambda: None)
    probed(picture, probe, call)  # type: ignore[arg-type]
    return probe.released


def test_the_relists_read_of_held_versions_lets_go_between_chunks(picture: Picture) -> None:
    """Before: one hold around the whole read (1 release)."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    releases = _releases(picture, lambda: found.update(picture.held_versions("claim")))
    assert len(found) == CLAIMS
    assert found[("ns-1", "claim-1")][0] == "1001"
    assert releases >= CLAIMS // HELD_CHUNK + 1, f"{releases} releases reading {CLAIMS} claims"


def test_the_check_of_what_a_list_lacks_answers_the_version_it_compared(picture: Picture) -> None:
    """`unlisted` copies the keys, then reads the few the list lacks: each with the (resourceVersion,
    uid) its deletion is taken in at (`observe_if_held`)."""
    listed = [{"metadata": {"namespace": f"ns-{i % 7}", "name": f"claim-{i}"}} for i in range(3, CLAIMS)]
    gone = picture.unlisted("claim", listed, str(10**9))
    assert sorted(one.body["metadata"]["name"] for one in gone) == ["claim-0", "claim-1", "claim-2"]
    assert gone[0].held == picture.held_version("claim", (gone[0].body["metadata"]["namespace"],
                                                          gone[0].body["metadata"]["name"]))
