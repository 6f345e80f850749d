"""scripts/cached-build.sh, the part every cached build shares, run as the build scripts run it (bash,
sourced) on a temporary ELASTICGPU_CACHE of fake build folders (issue 51 item 4).

Several checkouts share one cache (a clone and its worktrees): pruning the old builds after a new
one must never remove a build that another checkout's current.env still names, or that a running
process uses (its binary, its folder, a file of it open or mapped, its path in the process's
arguments or environment), and must still remove the rest. And the steps moved into it (the
Debian version pin) do what each build script did.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spawning import spawn

REPO = Path(__file__).resolve().parents[2]
HELPER = REPO / "scripts" / "cached-build.sh"
NAME = "fakebuild"
READY_TIMEOUT_S = 30.0

# What a build script sets before sourcing the helper, and the two functions it defines; then the
# helper function named by the arguments. Run from a file, never `bash -c`: a build path in bash's
# own arguments would make bash a user of that build.
DRIVER = f"""set -euo pipefail
NAME={NAME} WHAT=build MARKER=bin STRICT_VAR=
. "$FAKE_CHECKOUT/scripts/cached-build.sh"
build_complete() {{ [ -x "$1/bin" ]; }}
env_lines() {{ echo "FAKE_BIN=$1/bin"; echo "FAKE_VERSIONS=$1/versions.txt"; }}
"$@"
"""


class Cache:
    """A temporary cache root, fake build folders in <root>/fakebuild, and checkouts that use them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = tmp / "cache"
        self.builds = self.root / NAME
        self.builds.mkdir(parents=True)
        self.driver = tmp / "driver.sh"
        self.driver.write_text(DRIVER)
        self.made = 0

    def checkout(self, name: str) -> Path:
        """A checkout of the project (only what the helper needs of one: scripts/cached-build.sh)."""
        where = self.tmp / "checkouts" / name
        (where / "scripts").mkdir(parents=True)
        shutil.copy(HELPER, where / "scripts" / "cached-build.sh")
        return where

    def build(self, key: str) -> Path:
        """A complete build folder, newer than every one made before it."""
        folder = self.builds / key
        folder.mkdir()
        (folder / "bin").write_text("#!/bin/sh\n")
        (folder / "bin").chmod(0o755)
        self.made += 1
        stamp = time.time() - 1000 + self.made  # ls -t orders builds by their marker's time
        os.utime(folder / "bin", (stamp, stamp))
        return folder

    def run(self, checkout: Path, *call: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """One helper function, as the checkout's build script calls it."""
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.tmp),
                       "ELASTICGPU_CACHE": str(self.root), "FAKE_CHECKOUT": str(checkout), **(env or {})}  # fmt: skip
        return subprocess.run(["bash", str(self.driver), *call], env=environment, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    def use(self, checkout: Path, key: str) -> None:
        """The checkout's build script finds its build up to date: current.env and its record name it."""
        done = self.run(checkout, "exit_if_up_to_date", key)
        assert done.returncode == 0, done.stderr
        assert f"FAKE_BIN={self.builds / key}/bin" in done.stdout

    def finish(self, checkout: Path, key: str, keep: int = 2) -> str:
        """The checkout's build script has just built `key`: it names it and prunes; its log."""
        done = self.run(checkout, "finish_build", key, str(int(time.time())), str(keep))
        assert done.returncode == 0, done.stderr
        return done.stderr

    def left(self) -> list[str]:
        """The build folders still there."""
        return sorted(p.name for p in self.builds.iterdir() if (p / "bin").exists())


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path)


def test_without_users_the_newest_builds_stay_and_the_older_go(cache: Cache) -> None:
    a = cache.checkout("a")
    for key in ("k1", "k2", "k3", "k4"):
        cache.build(key)
    log = cache.finish(a, "k4", keep=2)
    assert cache.left() == ["k3", "k4"], log
    assert "keeping" not in log
    assert (cache.builds / "current.env").read_text().startswith(f"FAKE_BIN={cache.builds / 'k4'}/bin")


def test_a_build_another_checkout_names_is_kept(cache: Cache) -> None:
    a, b = cache.checkout("a"), cache.checkout("b")
    for key in ("k1", "k2", "k3", "k4"):
        cache.build(key)
    cache.use(a, "k1")  # a's tests run on k1; the shared current.env names k4 after b's build
    log = cache.finish(b, "k4", keep=2)
    assert cache.left() == ["k1", "k3", "k4"], log
    assert f"keeping {cache.builds / 'k1'}: a checkout's current.env names it" in log
    # Each checkout's own record: a's names k1, b's k4.
    records = {r.read_text().splitlines()[0]: r.read_text() for r in (cache.builds / "checkouts").glob("*.env")}
    assert f"FAKE_BIN={cache.builds / 'k1'}/bin" in records[f"# checkout={a}"]
    assert f"FAKE_BIN={cache.builds / 'k4'}/bin" in records[f"# checkout={b}"]


def test_a_checkout_that_is_gone_protects_nothing(cache: Cache) -> None:
    a, b = cache.checkout("a"), cache.checkout("b")
    for key in ("k1", "k2", "k3", "k4"):
        cache.build(key)
    cache.use(a, "k1")
    shutil.rmtree(a)  # the worktree removed: its record goes at the next prune, and k1 with it
    log = cache.finish(b, "k4", keep=2)
    assert cache.left() == ["k3", "k4"], log
    assert [r.read_text().splitlines()[0] for r in (cache.builds / "checkouts").glob("*.env")] == [f"# checkout={b}"]


def test_a_checkout_names_the_build_it_used_last(cache: Cache) -> None:
    a, b = cache.checkout("a"), cache.checkout("b")
    for key in ("k1", "k2", "k3", "k4", "k5"):
        cache.build(key)
    cache.use(a, "k1")
    cache.use(a, "k2")  # a moved on: k1 is no one's any more
    log = cache.finish(b, "k5", keep=2)
    assert cache.left() == ["k2", "k4", "k5"], log


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} within {READY_TIMEOUT_S:.0f}s"
        time.sleep(0.05)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _python_holding(how: str, target: Path, tmp: Path) -> subprocess.Popen[Any]:
    """A Python process that opens `target` (`fd`) or maps it and closes the file (`maps`), then
    sleeps; the path comes through a file, so it is in neither its arguments nor its environment."""
    where = tmp / f"{how}-target"
    where.write_text(str(target))
    ready = tmp / f"{how}-ready"
    code = (
        "import mmap, sys, time\n"
        "f = open(open(sys.argv[1]).read(), 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if sys.argv[3] == 'maps' else None\n"
        "if m is not None: f.close()\n"
        "open(sys.argv[2], 'w').close()\n"
        "time.sleep(300)\n"
    )
    child = spawn([sys.executable, "-c", code, str(where), str(ready), how])
    _wait_for(ready.exists, f"the {how} holder ready")
    return child


@pytest.fixture
def users() -> Iterator[list[subprocess.Popen[Any]]]:
    started: list[subprocess.Popen[Any]] = []
    yield started
    for child in started:
        child.kill()
        child.wait(timeout=30)


@pytest.mark.parametrize("how", ["exe", "cwd", "fd", "maps", "environ", "environ-folder", "arguments"])
def test_a_build_a_running_process_uses_is_kept_until_it_ends(
    cache: Cache, tmp_path: Path, users: list[subprocess.Popen[Any]], how: str
) -> None:
    a = cache.checkout("a")
    old = cache.build("k1")
    for key in ("k2", "k3"):
        cache.build(key)
    sleep = shutil.which("sleep")
    assert sleep is not None
    if how == "exe":  # run through a link outside the build: only /proc/<pid>/exe leads into it
        shutil.copy(sleep, old / "sleep")
        link = tmp_path / "sleep-link"
        link.symlink_to(old / "sleep")
        child = spawn([str(link), "300"])
        _wait_for(lambda: _readlink(f"/proc/{child.pid}/exe") == str(old / "sleep"), "sleep running from the build")
    elif how == "cwd":
        child = spawn([sleep, "300"], cwd=old)
    elif how in ("fd", "maps"):
        (old / "data").write_bytes(b"x" * 4096)
        child = _python_holding(how, old / "data", tmp_path)
    elif how == "environ":  # a test run that scripts/test.sh gave the build's paths
        child = spawn([sleep, "300"], env={"ELASTICGPU_FAKE_BIN": f"{old}/bin"})
    elif how == "environ-folder":
        child = spawn([sleep, "300"], env={"ELASTICGPU_FAKE_ROOT": str(old)})
    else:
        child = spawn([sys.executable, "-c", "import time; time.sleep(300)", f"--config={old}/config"])
    users.append(child)
    log = cache.finish(a, "k3", keep=1)
    assert cache.left() == ["k1", "k3"], log
    assert f"keeping {old}: in use by pid {child.pid} " in log
    child.kill()
    child.wait(timeout=30)
    log = cache.finish(a, "k3", keep=1)
    assert cache.left() == ["k3"], log


def test_a_folder_whose_name_only_starts_like_a_build_is_no_use_of_it(
    cache: Cache, users: list[subprocess.Popen[Any]]
) -> None:
    """k1's path is a prefix of k10's: a process that names k10 does not keep k1."""
    a = cache.checkout("a")
    cache.build("k1")
    cache.build("k10")
    cache.build("k2")
    sleep = shutil.which("sleep")
    assert sleep is not None
    users.append(spawn([sleep, "300"], env={"ELASTICGPU_FAKE_ROOT": str(cache.builds / "k10")}))
    log = cache.finish(a, "k2", keep=1)
    assert cache.left() == ["k10", "k2"], log


MADISON = """containerd | 2.1.4~ds1-1 | http://deb.debian.org/debian sid/main amd64 Packages
containerd | 1.7.24~ds1-6+b4 | http://deb.debian.org/debian trixie/main amd64 Packages
containerd | 1.6.20~ds1-1+b1 | http://deb.debian.org/debian bookworm/main amd64 Packages
      runc | 1.1.5+ds1-1+deb12u1 | http://deb.debian.org/debian bookworm/main amd64 Packages
"""


def test_the_debian_pin_takes_each_package_from_its_suite_in_order(cache: Cache, tmp_path: Path) -> None:
    """pin_versions (what testruntime, testprometheus and testnetwork did each on their own): one
    apt-cache madison for all, the version of the named suite, in the order given; a package the
    suite lacks falls back (here: no cached build to fall back to, so it fails, naming both)."""
    a = cache.checkout("a")
    tools = tmp_path / "tools"
    tools.mkdir()
    (tmp_path / "madison.txt").write_text(MADISON)
    calls = tmp_path / "apt-cache.calls"
    (tools / "apt-cache").write_text(f'#!/bin/sh\necho "$*" >>{calls}\ncat {tmp_path}/madison.txt\n')
    (tools / "apt-cache").chmod(0o755)
    path = {"PATH": f"{tools}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    versions = tmp_path / "versions"
    done = cache.run(a, "pin_versions", str(versions), "runc:bookworm", "containerd:trixie", env=path)
    assert done.returncode == 0, done.stderr
    assert versions.read_text() == "runc=1.1.5+ds1-1+deb12u1\ncontainerd=1.7.24~ds1-6+b4\n"
    assert calls.read_text().count("madison") == 1
    versions.unlink()
    done = cache.run(a, "pin_versions", str(versions), "containerd:sid", "runc:trixie", env=path)
    assert done.returncode == 1
    assert "package runc not found in trixie (and no cached build to fall back to)" in done.stderr
