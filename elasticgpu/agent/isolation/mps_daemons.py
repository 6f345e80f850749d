"""MPS control daemons, one per card that serves MPS claims: started, supervised, stopped.

    folders     <state>/<card uuid>/pipe (CUDA_MPS_PIPE_DIRECTORY; mounted into the card's MPS
                containers) and <state>/<card uuid>/log (CUDA_MPS_LOG_DIRECTORY); <state>/<uuid>/lock
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
                a command line that execs the control binary); it daemonises and writes
                <pipe>/nvidia-cuda-mps-control.pid, which is how it is found again (also after the agent
                restarts: the daemon outlives it, its clients need it)
    never two   every start and stop holds the card's lock file (flock; two agents by mistake, or
                two threads, wait for each other) and first reads the pid file: a live daemon whose
                command line is the control binary's is adopted, never started twice
    supervise   a thread checks every wanted card each `check_interval_s`; a daemon gone (killed,
                crashed) is started again, after a backoff that doubles per failure (to
                `backoff_max_s`) and resets once it has run `backoff_max_s`
    adopt       a live daemon of the state folder that this process did not start (the agent
                restarted) is taken over at the next sync: supervised while used, stopped once not
    stop        once no container of an MPS claim uses the card (`release_except`, from the
                runtime's containers): `echo quit | nvidia-cuda-mps-control` with the same env and
                namespace, then SIGKILL after `stop_timeout_s`; then the shm folder is unmounted
    ceiling     the daemon side of the limits (issue 33.7). A client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
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
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
SHM_SOURCE = "elasticgpu-mps-shm"
"""The source name of the agent's shm tmpfs mounts (in /proc/mounts: tells them from others)."""
TOOLS = ("unshare", "mount", "umount", "sh")
"""What the daemon's own /dev/shm takes on the node (util-linux and a shell)."""
# The wrapper the control binary is exec'd through, inside `unshare --mount`: the card's shm folder at
# /dev/shm of the new namespace only (propagation private: the host's /dev/shm is untouched), then exec.
_BIND_AND_EXEC = 'mount=$1 shm=$2; shift 2; "$mount" --bind "$shm" /dev/shm && exec "$@"'
_WRAPPER_NAME = "elasticgpu-mps-shm-wrapper"
"""The wrapper's $0: in the command lines of `unshare` and `sh` until the exec (never taken for the daemon)."""


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


@dataclass(frozen=True, order=True)
class Ceiling:
    """The most one MPS client of a card may use: percent of its compute (100: no ceiling) and MiB of its memory
    (0: no ceiling)."""

    cores: int = 100
    memory_mib: int = 0

    @classmethod
    def of(cls, cores: int, memory_mib: int) -> Ceiling:
        """The ceiling of one slice: a memory-only slice (0 cores) has no compute ceiling, a slice without memory
        (0 MiB) no memory ceiling."""
        return cls(cores if 0 < cores < 100 else 100, max(memory_mib, 0))

    def covering(self, other: Ceiling) -> Ceiling:
        """The ceiling that lets through what either does (a dimension without a ceiling in either has none)."""
        return Ceiling(max(self.cores, other.cores),
                       0 if 0 in (self.memory_mib, other.memory_mib) else max(self.memory_mib, other.memory_mib))

    def commands(self, servers: Iterable[int] = ()) -> list[str]:
        """The control commands that put this ceiling on the daemon: its defaults for servers spawned later, and
        each running server's own (MPS v2 interface; device 0: the daemon sees only its card)."""
        found = []
        if self.cores < 100:
            found.append(f"set_default_active_thread_percentage {self.cores}")
        if self.memory_mib > 0:
            found.append(f"set_default_device_pinned_mem_limit 0 {self.memory_mib}M")
        for server in servers:
            if self.cores < 100:
                found.append(f"set_active_thread_percentage {server} {self.cores}")
            if self.memory_mib > 0:
                found.append(f"set_device_pinned_mem_limit {server} 0 {self.memory_mib}M")
        return found



class NeedsAdmin(RuntimeError):
    """A daemon cannot start until the node's admin acts (a tool missing, a tmpfs that cannot be mounted)."""


def _alive(pid: int) -> bool:
    """True for a running (not zombie) process whose command line is the control binary's (not the wrapper's
    before its exec: its command line names the binary too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return (state not in ("Z", "X") and CONTROL.encode() in cmdline
            and _WRAPPER_NAME.encode() not in cmdline.split(b"\0"))


class MpsDaemons:
    """The node's MPS control daemons (see the module docstring). Thread-safe."""

    def __init__(self, *, control: Callable[[], str | None], state_dir: Path,
                 settings: DaemonSettings = DaemonSettings(), clock: Callable[[], float] = time.monotonic) -> None:
        """`control`: the control binary as the agent sees it, None when the node has none (asked at each start)."""
        self._control = control
        self._state_dir = state_dir
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

    # -- paths ---------------------------------------------------------------------------------

    def folder(self, uuid: str) -> Path:
        """The card's folder under the state dir."""
        return self._state_dir / uuid.lower()

    def pipe_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_PIPE_DIRECTORY."""
        return self.folder(uuid) / "pipe"

    def log_dir(self, uuid: str) -> Path:
        """The card's CUDA_MPS_LOG_DIRECTORY."""
        return self.folder(uuid) / "log"

    def shm_dir(self, uuid: str) -> Path:
        """The card's shared /dev/shm: a tmpfs the daemon and the card's MPS containers mount at /dev/shm."""
        return self.folder(uuid) / "shm"

    def env(self, uuid: str) -> dict[str, str]:
        """The environment of the card's control daemon and of `quit`."""
        return {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(uuid)),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir(uuid))}

    def pid(self, uuid: str) -> int | None:
        """The pid of the card's live daemon, or None. The pid file first; without it (a container sees the
        pipe folder writable and may have removed it), the process whose environment names the pipe folder."""
        try:
            pid = int((self.pipe_dir(uuid) / PID_FILE).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return self._by_environment(uuid)
        return pid if _alive(pid) else self._by_environment(uuid)

    def _by_environment(self, uuid: str) -> int | None:
        """The live control daemon whose CUDA_MPS_PIPE_DIRECTORY is the card's (a scan of /proc: only when the
        pid file does not lead to one)."""
        wanted = f"CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir(uuid)}".encode()
        try:
            entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
        except OSError:
            return None
        found: dict[int, int] = {}  # pid -> parent pid
        for entry in entries:
            try:
                if CONTROL.encode() not in Path(f"/proc/{entry}/cmdline").read_bytes():
                    continue
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if wanted in environ and _alive(int(entry)):
                found[int(entry)] = parent
        # The daemon, not a child it forked that has not yet exec'd (it has the daemon's command line).
        return min((pid for pid, parent in found.items() if parent not in found), default=None)

    @contextlib.contextmanager
    def _card_lock(self, uuid: str) -> Iterator[None]:
        folder = self.folder(uuid)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- the daemon's /dev/shm -----------------------------------------------------------------

    def problem(self) -> str | None:
        """Why the node cannot give a daemon its own /dev/shm (a tool missing from the agent's PATH), or None."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            return (f"{', '.join(missing)} not found in the agent's PATH: the MPS daemon's /dev/shm needs "
                    f"util-linux (unshare, mount, umount) and sh on the node")
        return None

    def _tool(self, name: str) -> str:
        found = shutil.which(name)
        if found is None:
            raise NeedsAdmin(self.problem() or f"{name} not found in the agent's PATH")
        return found

    def _wrapped(self, uuid: str, argv: list[str]) -> list[str]:
        """`argv` run in a mount namespace of its own with the card's shm folder at /dev/shm (an exec chain:
        nothing runs in the agent's process between fork and exec)."""
        return [self._tool("unshare"), "--mount", "--propagation", "private", "--", self._tool("sh"), "-c",
                _BIND_AND_EXEC, _WRAPPER_NAME, self._tool("mount"), str(self.shm_dir(uuid)), *argv]

    def _mount_shm(self, uuid: str) -> None:
        """The card's shm folder is a tmpfs of `shm_size_mib` (kept when it already is one: the card's
        containers hold it). Raises RuntimeError saying why it cannot be mounted."""
        shm = self.shm_dir(uuid)
        if os.path.ismount(shm):
            return
        size = self._settings.shm_size_mib
        if size < 1:  # tmpfs takes size=0 as no limit at all
            raise NeedsAdmin(f"the MPS /dev/shm size is {size} MiB: set --mps-shm-size-mib to 1 or more")
        shm.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run([self._tool("mount"), "-t", "tmpfs", "-o",
                                   f"size={size}m,mode=1777,nosuid,nodev,noexec", SHM_SOURCE, str(shm)],
                                  stdin=subprocess.DEVNULL, capture_output=True, start_new_session=True,
                                  timeout=self._settings.start_timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"mounting a tmpfs of {size} MiB at {shm} failed: {e}") from e
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip()[:200]
            # No fallback to a plain folder: its memory would be unbounded (or on disk), and the clients'
            # shared memory would outlive the daemon in the node's state folder.
            raise NeedsAdmin(f"mounting a tmpfs of {size} MiB at {shm} failed ({said}): the agent needs "
                             f"CAP_SYS_ADMIN in the host's mount namespace (it runs as root on the host) "
                             f"to give the card's MPS daemon and clients their shared /dev/shm")

    def _unmount_shm(self, uuid: str) -> None:
        """Unmount and remove the card's shm folder (a mount a container still holds stays alive there:
        lazily unmounted when busy)."""
        shm = self.shm_dir(uuid)
        for _ in range(4):  # a mount stacked on another (two agents by mistake) comes off one at a time
            if not os.path.ismount(shm):
                break
            umount = shutil.which("umount") or "umount"
            try:
                done = subprocess.run([umount, str(shm)], stdin=subprocess.DEVNULL, capture_output=True,
                                      start_new_session=True, timeout=self._settings.stop_timeout_s, check=False)
                if done.returncode != 0:
                    subprocess.run([umount, "-l", str(shm)], stdin=subprocess.DEVNULL, capture_output=True,
                                   start_new_session=True, timeout=self._settings.stop_timeout_s, check=False)
            except (OSError, subprocess.TimeoutExpired):
                break
        if os.path.ismount(shm):
            log.warning("the MPS /dev/shm of card %s at %s could not be unmounted; the next sync tries again",
                        uuid, shm)
            return
        with contextlib.suppress(FileNotFoundError, OSError):
            shm.rmdir()

    def _clean_stale(self, keep: set[str]) -> list[str]:
        """Unmount the shm folders of cards without a daemon that nobody wants or uses (an agent killed
        before it cleaned up). Returns their uuids."""
        cleaned: list[str] = []
        try:
            folders = [entry for entry in self._state_dir.iterdir() if entry.is_dir()]
        except FileNotFoundError:
            return cleaned
        for folder in folders:
            key = folder.name
            if key in keep or not (folder / "shm").exists():
                continue
            with self._lock:
                if key in self._wanted:
                    continue
            with self._card_lock(key):
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
        key = uuid.lower()
        with self._lock:
            self._wanted[key] = self._clock()
            self._spelled[key] = uuid
            if ceiling is not None:
                known = self._ceilings.get(key)
                self._ceilings[key] = ceiling if known is None else known.covering(ceiling)
        if (pid := self.pid(uuid)) is not None:
            if not os.path.ismount(self.shm_dir(uuid)):
                # A daemon started before the agent gave daemons a /dev/shm of their own (an upgrade): a client
                # in a container would not reach it. Stopping it would end its clients' work: it goes once no
                # container uses the card (release_except), and the next container gets a new one.
                raise RuntimeError(f"its daemon (pid {pid}) runs without the card's /dev/shm at "
                                   f"{self.shm_dir(uuid)} (started by an earlier agent version); it is replaced "
                                   f"once no MPS container uses the card")
            with self._card_lock(uuid):
                self._apply_ceiling(uuid)
            return
        self._start(uuid)
        self._start_thread()

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
                                  env=self.env(uuid), capture_output=True, start_new_session=True,
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
            raise RuntimeError(f"{CONTROL} is not installed under the driver root")
        return control

    def wanted(self) -> set[str]:
        """Lowercased uuids of the cards whose daemons are kept running."""
        with self._lock:
            return set(self._wanted)

    def adopt(self) -> list[str]:
        """Take over the live daemons of the state folder this process did not start (an agent that
        restarted: its daemons outlived it): they are supervised, and stopped once unused. Returns their uuids."""
        adopted: list[str] = []
        try:
            folders = [entry for entry in self._state_dir.iterdir() if entry.is_dir()]
        except FileNotFoundError:
            return adopted
        for folder in folders:
            key = folder.name
            with self._lock:
                if key in self._wanted:
                    continue
            if self.pid(key) is None:
                continue
            try:
                spelled = (folder / "uuid").read_text().strip() or key
            except OSError:
                spelled = key
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
            idle = [uuid for uuid, since in self._wanted.items()
                    if uuid not in keep and now - since >= self._settings.idle_grace_s]
            for uuid in idle:
                del self._wanted[uuid]
                self._failures.pop(uuid, None)
                self._next_try.pop(uuid, None)
                self._ceilings.pop(uuid, None)  # the next daemon of the card starts from its first slice
                self._applied.pop(uuid, None)
        for uuid in idle:
            self.stop(self._spelled.pop(uuid, uuid))
        self._clean_stale(keep)
        return idle

    # -- starting and stopping -----------------------------------------------------------------

    def _start(self, uuid: str) -> None:
        control = self._control()
        if control is None:
            raise RuntimeError(f"{CONTROL} is not installed under the driver root")
        with self._card_lock(uuid):
            if self.pid(uuid) is not None:
                return  # started meanwhile (another thread, or an agent by mistake): never two
            self.pipe_dir(uuid).mkdir(parents=True, exist_ok=True)
            self.log_dir(uuid).mkdir(parents=True, exist_ok=True)
            self._mount_shm(uuid)
            (self.folder(uuid) / "uuid").write_text(uuid + "\n")  # as the driver spells it, for a later agent
            with contextlib.suppress(FileNotFoundError):
                (self.pipe_dir(uuid) / PID_FILE).unlink()  # a dead daemon's: the new one writes its own
            errors_file = self.log_dir(uuid) / "start.err"
            try:
                # Its output to a file, not a pipe: the daemon it forks may keep a pipe open, and a read
                # of the pipe would wait for the daemon to end.
                with open(errors_file, "wb") as err:
                    done = subprocess.run(self._wrapped(uuid, [control, "-d"]), env=self.env(uuid),
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True, timeout=self._settings.start_timeout_s,
                                          check=False)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise RuntimeError(f"{control} -d failed: {e}") from e
            if done.returncode != 0:
                said = errors_file.read_text(errors="replace").strip()[:200]
                raise RuntimeError(f"{control} -d exited with {done.returncode}: {said}")
            deadline = self._clock() + self._settings.start_timeout_s
            while self.pid(uuid) is None:
                if self._clock() >= deadline:
                    raise RuntimeError(f"{control} -d wrote no live pid in {self.pipe_dir(uuid) / PID_FILE}")
                time.sleep(0.01)
            self.starts += 1
            with self._lock:
                self._started_at[uuid.lower()] = self._clock()
            # MPS forgets its limits on quit: a daemon started again (after a crash, or a tenant's `quit`) gets
            # the card's ceiling before any new client can reach it through the agent.
            self._apply_ceiling(uuid)
        log.info("MPS control daemon of card %s started (pid %s)", uuid, self.pid(uuid))

    def stop(self, uuid: str) -> None:
        """Quit the card's daemon (`quit`, then SIGKILL after the timeout) and remove its /dev/shm."""
        control = self._control()
        with self._card_lock(uuid):
            pid = self.pid(uuid)
            if pid is None:
                self._unmount_shm(uuid)
                return
            if control is not None:
                with contextlib.suppress(OSError, subprocess.TimeoutExpired, RuntimeError):
                    subprocess.run(self._wrapped(uuid, [control]), input=b"quit\n", env=self.env(uuid),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                   timeout=self._settings.stop_timeout_s, check=False)
            deadline = self._clock() + self._settings.stop_timeout_s
            while _alive(pid) and self._clock() < deadline:
                time.sleep(0.02)
            if _alive(pid):
                log.warning("MPS control daemon of card %s (pid %d) did not quit in %gs: killed", uuid, pid,
                            self._settings.stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                deadline = self._clock() + self._settings.stop_timeout_s
                while _alive(pid) and self._clock() < deadline:
                    time.sleep(0.02)
            self._unmount_shm(uuid)
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
                failures = self._failures.get(uuid, 0)
                self._failures[uuid] = failures + 1
                wait = min(self._settings.backoff_initial_s * (2 ** failures), self._settings.backoff_max_s)
                self._next_try[uuid] = now + wait
            log.warning("MPS control daemon of card %s is gone; starting it again (next try in %gs if it fails)",
                        self._spelled.get(uuid, uuid), wait)
            try:
                self._start(self._spelled.get(uuid, uuid))
            except RuntimeError as e:
                log.warning("MPS control daemon of card %s: %s", uuid, e)

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
