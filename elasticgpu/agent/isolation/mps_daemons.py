"""MPS control daemons, one per card that serves MPS claims: started, supervised, stopped.

    folders     <state>/<card uuid>/pipe (CUDA_MPS_PIPE_DIRECTORY; mounted into the card's MPS
                containers) and <state>/<card uuid>/log (CUDA_MPS_LOG_DIRECTORY); <state>/<uuid>/lock
                and the agent's record of the daemon (mps_folders: who may write each)
    shm         <state>/<card uuid>/shm: a tmpfs of `shm_size_mib` the agent mounts before the card's
                first start. The MPS server and its clients share POSIX shared memory (/dev/shm), and a
                container has a /dev/shm of its own: the daemon runs in a mount namespace of its own with
                this folder bound at /dev/shm, and each MPS container of the card gets it at /dev/shm too
                (as NVIDIA's device plugin does, one tmpfs per card here). It stays mounted while the
                card's containers may use it (across daemon restarts: containers hold the mount they got),
                and is unmounted and removed when the daemon stops for good, or found stale at a sync (no
                daemon, no container of the card: an agent killed before it cleaned up)
    start       `nvidia-cuda-mps-control -d` with CUDA_VISIBLE_DEVICES=<uuid> and both folders, through
                `unshare --mount --propagation private` and `mount --bind <shm> /dev/shm` (util-linux:
                a command line that execs the control binary: mps_shm); it daemonises and writes
                <pipe>/nvidia-cuda-mps-control.pid, a hint only (containers can write the pipe folder): the
                process it names is checked to be the card's daemon (mps_finding) and recorded, with its
                start time, where only the agent writes; that record is how it is found again (also after
                the agent restarts: the daemon outlives it, its clients need it)
    never two   every start and stop holds the card's lock file (flock; two agents by mistake, or
                two threads, wait for each other) and first looks for the card's daemon: a live one
                is adopted, never started twice
    never none  `ensure` looks for the daemon and starts it under that lock, and returns once the
                daemon wrote its pid file (before, the launcher's child is found, not yet serving);
                a release's stop, under the lock, keeps a card wanted again since it decided (a
                container prepared meanwhile), and the supervisor starts only a card still wanted
    supervise   a thread checks every wanted card each `check_interval_s`; a daemon gone (killed,
                crashed) is started again, after a backoff that doubles per failure (to
                `backoff_max_s`) and resets once it has run `backoff_max_s`
    adopt       a live daemon of the state folder that this process did not start (the agent
                restarted) is taken over at the next sync: supervised while used, stopped once not
    stop        once no container of an MPS claim uses the card (`release_except`, from the
                runtime's containers): `echo quit | nvidia-cuda-mps-control` with the same env and
                namespace, then SIGKILL after `stop_timeout_s` (through a pidfd, once the process is checked
                to be still the card's daemon); then the shm folder is unmounted
    ceiling     the daemon side of the limits (issue 33.7; mps_ceiling). A client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
                and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT are its own environment: a process can start a
                child with other values. MPS obeys the lower of the client's value and the control
                daemon's, so the agent sets the daemon's to the card's ceiling, the largest slice of an
                MPS claim the daemon has served since it started (a memory-only slice: no compute
                ceiling; a slice without memory: none for memory): `set_default_active_thread_percentage`
                and `set_default_device_pinned_mem_limit 0 <MiB>M` for servers spawned later, and per
                running server (`get_server_list`) `set_active_thread_percentage <pid>` and
                `set_device_pinned_mem_limit <pid> 0 <MiB>M`. Sent after every start (MPS forgets them
                on `quit`) and whenever a larger slice comes. With one MPS claim on the card, its size
                holds against a child that rewrites its environment; with several, a client can reach
                the largest claim's size, never the whole card. Anyone who can write to the pipe
                folder can also send these commands, `quit` included: see docs/isolation.md.

Processes are started with `start_new_session` (no preexec_fn: the agent has loaded grpc, whose
threads make a fork with Python code before exec unsafe; the namespace is made by the `unshare` the
agent execs, never in the agent's own process). The agent must run in the host's mount namespace: the
runtime mounts the shm folder into containers, so it must see the tmpfs the agent mounted there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from elasticgpu.agent.isolation import mps_finding, mps_shm
from elasticgpu.agent.isolation.mps_ceiling import Ceiling
from elasticgpu.agent.isolation.mps_folders import CardFolders

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DaemonSettings:
    """How the daemons are run."""

    stop_timeout_s: float = 10.0
    """Seconds a daemon has to quit after `quit` before it is killed."""
    start_timeout_s: float = 10.0
    """Seconds `nvidia-cuda-mps-control -d` has to daemonise and write its pid file."""
    check_interval_s: float = 2.0
    """Seconds between checks that each wanted daemon still runs."""
    backoff_initial_s: float = 1.0
    """Seconds before the first restart of a daemon that died; doubled per failure."""
    backoff_max_s: float = 60.0
    """Longest wait between restarts; a daemon that ran this long starts the count again."""
    idle_grace_s: float = 30.0
    """Seconds a card's daemon is kept after a container was prepared for it, even when no container of
    the runtime names the card yet (the runtime may still be creating it)."""
    shm_size_mib: int = 64
    """MiB of the tmpfs a card's daemon and its containers share as /dev/shm (NVIDIA's device plugin mounts
    64 MiB for its daemons); bounds the node memory the card's MPS clients can pin there."""


class MpsDaemons:
    """The node's MPS control daemons (see the module docstring). Thread-safe."""

    def __init__(self, *, control: Callable[[], str | None], state_dir: Path,
                 settings: DaemonSettings = DaemonSettings(), clock: Callable[[], float] = time.monotonic) -> None:
        """`control`: the control binary as the agent sees it, None when the node has none (asked at each start)."""
        self._control = control
        self.folders = CardFolders(state_dir)
        self._settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._wanted: dict[str, float] = {}  # lowercased uuid -> when a container was last prepared for it
        self._spelled: dict[str, str] = {}  # lowercased uuid -> as the driver spells it (CUDA_VISIBLE_DEVICES)
        self._failures: dict[str, int] = {}
        self._next_try: dict[str, float] = {}
        self._started_at: dict[str, float] = {}
        self._ceilings: dict[str, Ceiling] = {}  # lowercased uuid -> the largest slice its daemon served
        self._applied: dict[str, tuple[int, Ceiling]] = {}  # lowercased uuid -> (daemon pid, ceiling it was given)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.starts = 0
        """Daemons started by this process (for tests and logs)."""

    # -- paths and the daemon's process --------------------------------------------------------

    def folder(self, uuid: str) -> Path:
        """The card's folder under the state dir."""
        return self.folders.folder(uuid)

    def pipe_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_PIPE_DIRECTORY."""
        return self.folders.pipe_dir(uuid)

    def log_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_LOG_DIRECTORY."""
        return self.folders.log_dir(uuid)

    def shm_dir(self, uuid: str) -> Path:
        """The card's shared /dev/shm."""
        return self.folders.shm_dir(uuid)

    def problem(self) -> str | None:
        """Why the node cannot give a daemon its own /dev/shm, or None."""
        return mps_shm.problem()

    def pid(self, uuid: str) -> int | None:
        """The pid of the card's live daemon, or None: the agent's record first, else the daemon's pid file, else
        a scan for the process whose environment names the pipe folder (the pid file is in a folder containers
        can write: a tenant may remove it, or name another process there). Whatever leads to a process, it is
        taken only when mps_finding says it is the card's daemon; then it is recorded."""
        pipe = self.folders.pipe_dir(uuid)
        recorded = self.folders.recorded(uuid)
        if recorded is not None and mps_finding.start_time(recorded[0]) == recorded[1] \
                and mps_finding.ours(recorded[0], pipe):
            return recorded[0]
        hinted = self.folders.hinted_pid(uuid)
        pid = hinted if hinted is not None and mps_finding.ours(hinted, pipe) else mps_finding.by_environment(pipe)
        if pid is None:
            return None
        started = mps_finding.start_time(pid)
        if started is None:
            return None
        with contextlib.suppress(OSError):  # the folder removed meanwhile: found again by the next call
            self.folders.record(uuid, pid, started)
        return pid

    def _wrapped(self, uuid: str, argv: list[str]) -> list[str]:
        return mps_shm.wrapped(self.shm_dir(uuid), argv)

    def _unmount_shm(self, uuid: str) -> None:
        mps_shm.unmount(self.shm_dir(uuid), card=uuid, timeout_s=self._settings.stop_timeout_s)

    def _clean_stale(self, keep: set[str]) -> list[str]:
        """Unmount the shm folders of cards without a daemon that nobody wants or uses (an agent killed
        before it cleaned up). Returns their uuids."""
        cleaned: list[str] = []
        for key in self.folders.cards():
            if key in keep or not self.folders.shm_dir(key).exists():
                continue
            with self._lock:
                if key in self._wanted:
                    continue
            with self.folders.card_lock(key):
                with self._lock:
                    if key in self._wanted:
                        continue
                if self.pid(key) is not None:
                    continue
                self._unmount_shm(key)
            cleaned.append(key)
            log.info("MPS /dev/shm of card %s removed: no daemon and no MPS container uses the card (an agent "
                     "stopped before it cleaned up)", key)
        return cleaned

    # -- the CRI hook's side -------------------------------------------------------------------

    def ensure(self, uuid: str, ceiling: Ceiling | None = None) -> None:
        """The card's daemon runs (started now if it does not), with a ceiling that covers `ceiling` (a slice about
        to use the card; None: none asked); raises RuntimeError saying why it cannot."""
        self._want(uuid, ceiling)
        # The look for the daemon and what follows hold the card's lock: a daemon found outside it could be one a
        # release is stopping (then the container was prepared for no daemon). Wanted again under the lock: a
        # release that decided to stop the card before finds it wanted and keeps the daemon (_stop_unless_wanted).
        with self.folders.card_lock(uuid):
            self._want(uuid, ceiling)
            if (pid := self.pid(uuid)) is None:
                self._start_locked(uuid, self._control_binary())
            elif not os.path.ismount(self.shm_dir(uuid)):
                # A daemon started before the agent gave daemons a /dev/shm of their own (an upgrade): a client
                # in a container would not reach it. Stopping it would end its clients' work: it goes once no
                # container uses the card (release_except), and the next container gets a new one.
                raise RuntimeError(f"its daemon (pid {pid}) runs without the card's /dev/shm at "
                                   f"{self.shm_dir(uuid)} (started by an earlier agent version); it is replaced "
                                   f"once no MPS container uses the card")
            else:
                self._apply_ceiling(uuid)
        self._start_thread()

    def _want(self, uuid: str, ceiling: Ceiling | None) -> None:
        """Mark the card's daemon wanted now, with a ceiling that covers `ceiling`."""
        key = uuid.lower()
        with self._lock:
            self._wanted[key] = self._clock()
            self._spelled[key] = uuid
            if ceiling is not None:
                known = self._ceilings.get(key)
                self._ceilings[key] = ceiling if known is None else known.covering(ceiling)

    def ceiling(self, uuid: str) -> Ceiling | None:
        """The ceiling the card's daemon is kept at (None: no slice asked one since it started)."""
        with self._lock:
            return self._ceilings.get(uuid.lower())

    def _apply_ceiling(self, uuid: str) -> None:
        """Give the card's live daemon its ceiling, unless this daemon has it already (the caller holds the card's
        lock). Raises RuntimeError when the control binary refuses: the container is then refused, retryably,
        rather than started with limits only its own environment sets."""
        key = uuid.lower()
        pid = self.pid(uuid)
        with self._lock:
            ceiling = self._ceilings.get(key)
            if pid is None or ceiling is None or self._applied.get(key) == (pid, ceiling):
                return
        servers = [int(word) for word in self._ask(uuid, "get_server_list").split() if word.isdigit()]
        commands = ceiling.commands(servers)
        if commands:
            self._control_commands(uuid, commands)
        with self._lock:
            self._applied[key] = (pid, ceiling)
        log.info("MPS control daemon of card %s (pid %s): ceiling %s%% of compute, %s MiB per client%s", uuid, pid,
                 ceiling.cores, ceiling.memory_mib or "no limit of",
                 f" (servers {', '.join(map(str, servers))})" if servers else "")  # fmt: skip

    def _ask(self, uuid: str, command: str) -> str:
        """One command to the card's control daemon; its answer."""
        return self._control_commands(uuid, [command])

    def _control_commands(self, uuid: str, commands: list[str]) -> str:
        control = self._control_binary()
        try:
            done = subprocess.run(self._wrapped(uuid, [control]), input="".join(f"{c}\n" for c in commands).encode(),
                                  env=self.folders.env(uuid), capture_output=True, start_new_session=True,
                                  timeout=self._settings.start_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"{control} did not take {commands[0]!r}: {e}") from e
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[:200]
            raise RuntimeError(f"{control} refused {commands[0]!r} (exit {done.returncode}): {said}")
        return done.stdout.decode(errors="replace")

    def _control_binary(self) -> str:
        control = self._control()
        if control is None:
            raise RuntimeError(f"{mps_finding.CONTROL} is not installed under the driver root")
        return control

    def wanted(self) -> set[str]:
        """Lowercased uuids of the cards whose daemons are kept running."""
        with self._lock:
            return set(self._wanted)

    def adopt(self) -> list[str]:
        """Take over the live daemons of the state folder this process did not start (an agent that
        restarted: its daemons outlived it): they are supervised, and stopped once unused. Returns their uuids."""
        adopted: list[str] = []
        for key in self.folders.cards():
            with self._lock:
                if key in self._wanted:
                    continue
            if self.pid(key) is None:
                continue
            spelled = self.folders.spelled(key)
            with self._lock:
                # As if prepared a grace ago: stopped at once when no container uses it.
                self._wanted.setdefault(key, self._clock() - self._settings.idle_grace_s)
                self._spelled.setdefault(key, spelled)
                self._started_at.setdefault(key, self._clock())
            adopted.append(key)
            log.info("MPS control daemon of card %s (pid %s), started before this agent: adopted", spelled,
                     self.pid(key))
        if adopted:
            self._start_thread()
        return adopted

    def release_except(self, used: Iterable[str]) -> list[str]:
        """Stop the daemons of wanted cards no container uses (past the idle grace); returns their uuids.
        Daemons left by an earlier agent are adopted first, so they are stopped too once unused."""
        self.adopt()
        keep = {uuid.lower() for uuid in used}
        now = self._clock()
        with self._lock:
            idle = {uuid: self._spelled.pop(uuid, uuid) for uuid, since in self._wanted.items()
                    if uuid not in keep and now - since >= self._settings.idle_grace_s}
            for uuid in idle:
                del self._wanted[uuid]
                self._failures.pop(uuid, None)
                self._next_try.pop(uuid, None)
                self._ceilings.pop(uuid, None)  # the next daemon of the card starts from its first slice
                self._applied.pop(uuid, None)
        stopped = [uuid for uuid, spelled in idle.items() if self._stop_unless_wanted(spelled)]
        self._clean_stale(keep)
        return stopped

    # -- starting and stopping -----------------------------------------------------------------

    def _start_locked(self, uuid: str, control: str) -> None:
        """Start the card's daemon, found by no one (the caller holds the card's lock and looked: never two); returns
        once the daemon wrote its pid file, with its ceiling."""
        self.pipe_dir(uuid).mkdir(parents=True, exist_ok=True)
        self.log_dir(uuid).mkdir(parents=True, exist_ok=True)
        mps_shm.mount(self.shm_dir(uuid), size_mib=self._settings.shm_size_mib,
                      timeout_s=self._settings.start_timeout_s)
        self.folders.write_uuid(uuid)
        self.folders.forget(uuid)  # a dead daemon's: the new one writes its own
        errors_file = self.log_dir(uuid) / "start.err"
        try:
            # Its output to a file, not a pipe: the daemon it forks may keep a pipe open, and a read
            # of the pipe would wait for the daemon to end.
            with open(errors_file, "wb") as err:
                done = subprocess.run(self._wrapped(uuid, [control, "-d"]), env=self.folders.env(uuid),
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                      start_new_session=True, timeout=self._settings.start_timeout_s,
                                      check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"{control} -d failed: {e}") from e
        if done.returncode != 0:
            said = errors_file.read_text(errors="replace").strip()[:200]
            raise RuntimeError(f"{control} -d exited with {done.returncode}: {said}")
        self._wait_started(uuid, control)
        self.starts += 1
        with self._lock:
            self._started_at[uuid.lower()] = self._clock()
        # MPS forgets its limits on quit: a daemon started again (after a crash, or a tenant's `quit`) gets
        # the card's ceiling before any new client can reach it through the agent.
        self._apply_ceiling(uuid)
        log.info("MPS control daemon of card %s started (pid %s)", uuid, self.pid(uuid))

    def _wait_started(self, uuid: str, control: str) -> None:
        """Wait until the daemon just launched wrote its own pid file. A process with the card's environment is
        found before: the launcher's forked child, not yet serving (the real daemon creates its pipes and then its
        pid file; a CUDA client that finds no daemon in the pipe folder runs without MPS, outside the limits). A
        daemon found whose pid file never comes (a container of the card removed it) is taken at the deadline."""
        deadline = self._clock() + self._settings.start_timeout_s
        while (pid := self.pid(uuid)) is None or self.folders.hinted_pid(uuid) != pid:
            if self._clock() >= deadline:
                if pid is None:
                    raise RuntimeError(f"{control} -d started no daemon of its pipe folder {self.pipe_dir(uuid)}")
                log.warning("MPS control daemon of card %s (pid %d) wrote no pid file in %gs; taken as started",
                            uuid, pid, self._settings.start_timeout_s)
                return
            time.sleep(0.01)

    def stop(self, uuid: str) -> None:
        """Quit the card's daemon (`quit`, then SIGKILL after the timeout) and remove its /dev/shm."""
        with self.folders.card_lock(uuid):
            self._stop_locked(uuid)

    def _stop_unless_wanted(self, uuid: str) -> bool:
        """Stop the card's daemon unless a container was prepared for the card since the release decided to stop it
        (that ensure waits for this lock, or found the daemon before it: either way the daemon stays). True when
        stopped."""
        with self.folders.card_lock(uuid):
            with self._lock:
                if uuid.lower() in self._wanted:
                    log.info("MPS control daemon of card %s kept: a container was prepared for the card meanwhile",
                             uuid)
                    return False
            self._stop_locked(uuid)
        return True

    def _stop_locked(self, uuid: str) -> None:
        control = self._control()
        pipe = self.pipe_dir(uuid)
        pid = self.pid(uuid)
        started = None if pid is None else mps_finding.start_time(pid)
        if pid is None or started is None:
            self._unmount_shm(uuid)
            self.folders.forget(uuid)
            return

        def running() -> bool:  # still the daemon found above (a pid reused meanwhile is not)
            return mps_finding.start_time(pid) == started and mps_finding.ours(pid, pipe)

        if control is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired, RuntimeError):
                subprocess.run(self._wrapped(uuid, [control]), input=b"quit\n", env=self.folders.env(uuid),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                               timeout=self._settings.stop_timeout_s, check=False)
        deadline = self._clock() + self._settings.stop_timeout_s
        while running() and self._clock() < deadline:
            time.sleep(0.02)
        if running():
            log.warning("MPS control daemon of card %s (pid %d) did not quit in %gs: killed", uuid, pid,
                        self._settings.stop_timeout_s)
            mps_finding.kill(pid, started, pipe)
            deadline = self._clock() + self._settings.stop_timeout_s
            while running() and self._clock() < deadline:
                time.sleep(0.02)
        self._unmount_shm(uuid)
        self.folders.forget(uuid)
        log.info("MPS control daemon of card %s stopped: no MPS claim uses the card", uuid)

    # -- supervising ---------------------------------------------------------------------------

    def _start_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._supervise, name="mps-daemons", daemon=True)
            self._thread.start()

    def check(self) -> None:
        """One pass: start the wanted daemons that are gone, each after its backoff."""
        now = self._clock()
        for uuid in sorted(self.wanted()):
            if self.pid(uuid) is not None:
                with self._lock:
                    if now - self._started_at.get(uuid, now) >= self._settings.backoff_max_s:
                        self._failures.pop(uuid, None)  # ran long enough: the next failure starts over
                continue
            with self._lock:
                if now < self._next_try.get(uuid, 0.0):
                    continue
                spelled = self._spelled.get(uuid, uuid)
            try:
                self._restart(spelled, now)
            except RuntimeError as e:
                log.warning("MPS control daemon of card %s: %s", uuid, e)

    def _restart(self, uuid: str, now: float) -> None:
        """Start the card's daemon again, after its backoff. Decided under the card's lock: a daemon an ensure (or
        another agent) is starting is not gone, and a card a release stopped meanwhile gets none (nobody would use
        it)."""
        key = uuid.lower()
        with self.folders.card_lock(uuid):
            with self._lock:
                if key not in self._wanted:
                    return
            if self.pid(uuid) is not None:
                return
            with self._lock:
                failures = self._failures.get(key, 0)
                self._failures[key] = failures + 1
                wait = min(self._settings.backoff_initial_s * (2 ** failures), self._settings.backoff_max_s)
                self._next_try[key] = now + wait
            log.warning("MPS control daemon of card %s is gone; starting it again (next try in %gs if it fails)",
                        uuid, wait)
            self._start_locked(uuid, self._control_binary())  # after the backoff's count: said once per try

    def _supervise(self) -> None:
        while not self._stop.wait(self._settings.check_interval_s):
            try:
                self.check()
            except Exception:  # the supervisor never dies: the next pass tries again
                log.exception("checking the MPS control daemons failed")

    def close(self) -> None:
        """Stop supervising (the daemons keep running: containers use them; the next agent adopts them)."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)
