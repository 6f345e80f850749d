"""The CRI front: nginx on kubelet's socket, routing each call by its gRPC method.

A Python gRPC hop costs about 0.6 ms at p50 and 2-3 ms at p99 on a loaded node; nginx parses
HTTP/2 in C and adds about 0.2 ms at p50, 0.3-1.2 ms at p99 (bench/cri_proxy.py, bench/README.md).
Only three methods need the agent, so only they take the Python hop:

    kubelet --unix, HTTP/2--> nginx (listen, mode 0600)
        CreateContainer, RemoveContainer,       -> the agent's CriProxy on its hook socket
        RemovePodSandbox (proxy.INTERCEPTED)       (injection, ledger), which forwards to the runtime
        every other path, known or not,         -> the runtime's socket (containerd, CRI-O) directly
        unary or streaming, both services

What kubelet relies on, and how the config keeps it (`render_config`):
- message sizes: no request body limit (nginx's default is 1 MB; CreateContainer can be large)
  and no response size limit; the runtime's own limits answer as they would without the front;
- long calls: PullImage runs for minutes, GetContainerEvents stays open for hours and ExecSync
  carries its own deadline (grpc-timeout, passed through and enforced by the runtime); nginx's
  read and send timeouts are `stream_timeout_s` (a week), never shorter than any of these;
- status and metadata: headers, trailers (grpc-status, grpc-message, details) pass untouched;
- an upstream that is down (no socket, refused, no answer within `connect_timeout_s`) is answered
  at once with a gRPC UNAVAILABLE whose message names the socket: kubelet retries, never hangs;
- one nginx process (`master_process off`): no user switch (root or not, it stays the agent's
  user, who can reach the runtime's socket), no orphaned worker after a kill -9, exits on SIGTERM.

nginx makes its unix socket mode 0666 itself. So it binds in a private folder (mode 0700) next
to `listen`; the socket is then made 0600, hard-linked to a temporary name and renamed onto
`listen`: kubelet's path never shows a socket open to others, and names a listening one only.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from elasticgpu.agent.cri import proxy

log = logging.getLogger(__name__)

HOOKED_METHODS = proxy.INTERCEPTED_METHODS
"""gRPC paths nginx routes to the agent's proxy; all others go to the runtime."""
MODES = ("auto", "nginx", "none")
"""--cri-front: `nginx`, `none` (the Python proxy on kubelet's socket) or `auto` (nginx when found)."""
_UNSAFE = re.compile(r"[\s\"'\\;{}$#%]")  # would end or change an nginx config token
LOG_REPEAT_S = 60.0
"""Seconds before the same problem in nginx's log is logged again."""
_LOG_HEAD = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (\[\w+\]) \d+#\d+: (?:\*\d+ )?")


def log_problem(line: str) -> str:
    """What a line of nginx's error log is about, without its time, process, connection and
    request: `[crit] connect() to unix:/run/x.sock failed (111: Connection refused)`."""
    head = _LOG_HEAD.match(line)
    if head is None:
        return line
    return f"{head.group(1)} {line[head.end():].split(' while ', 1)[0].split(', client: ', 1)[0]}"


class FrontError(RuntimeError):
    """nginx could not be started (the message says why and what to fix)."""


@dataclass(frozen=True, kw_only=True)
class FrontSettings:
    """Where the front listens, where it routes, where nginx keeps its files."""

    listen: Path
    """kubelet's socket (its --container-runtime-endpoint), mode 0600."""
    runtime: str
    """The runtime's own CRI socket, as a path or `unix://` target."""
    hook: Path
    """The agent's CriProxy socket, which the hooked methods go to."""
    state_dir: Path
    """nginx's config, pid file and temp folders (made at start, mode 0700)."""
    nginx: str = "nginx"
    """The nginx binary (1.22 or newer, with the http_v2 and grpc modules: Debian's `nginx`)."""
    nginx_version: tuple[int, ...] = (1, 22, 1)
    """Its version (`nginx_version`): from 1.25.1 HTTP/2 is `http2 on;`, the listen parameter deprecated."""
    stream_timeout_s: int = 7 * 86400
    """Seconds nginx waits for the next bytes of a call either way before it cuts it. A week:
    a GetContainerEvents stream is quiet for as long as no container changes. (nginx's timers
    are milliseconds in an int: at most 24 days.)"""
    connect_timeout_s: int = 5
    """Seconds to connect to an upstream socket before the caller gets UNAVAILABLE (a unix
    socket connects at once or is refused; this bounds an upstream whose backlog is full)."""
    keepalive_connections: int = 16
    """Idle upstream connections kept per upstream (nginx opens one per call in flight)."""
    start_timeout_s: float = 10.0
    """Seconds nginx may take to listen before its start counts as failed."""
    stop_timeout_s: float = 5.0
    """Seconds nginx gets to exit on SIGTERM before it is killed."""


def bind_path(listen: Path) -> Path:
    """Where nginx binds before its socket is renamed onto `listen`: a private folder beside it
    (the same filesystem, so the rename is atomic)."""
    return listen.parent / f".{listen.name}.front" / "nginx.sock"


def _socket_path(target: str | Path) -> str:
    text = str(target)
    for prefix in ("unix://", "unix:"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _checked(what: str, value: str | Path) -> str:
    text = str(value)
    if not text.startswith("/") or _UNSAFE.search(text):
        raise FrontError(
            f"{what} {text!r} must be an absolute path without spaces, quotes, ';', '{{', '}}', "
            "'$', '#' or '%' (it is written into nginx's config); choose another path"
        )
    return text


def render_config(settings: FrontSettings, *, bind: Path) -> str:
    """nginx's config for the front: a pure function of the settings and the bind path."""
    state = _checked("--cri-front-dir", settings.state_dir)
    runtime = _checked("--cri-upstream", _socket_path(settings.runtime))
    hook = _checked("the hook socket", settings.hook)
    listen = _checked("the front's bind path (from --cri-listen)", bind)
    timeout = f"{settings.stream_timeout_s}s"
    keepalive = settings.keepalive_connections

    def upstream(name: str, socket: str) -> str:
        # keepalive_requests/time: nginx otherwise closes an upstream connection after 1000
        # calls or an hour, a reconnect on the path of some call.
        return (
            f"  upstream {name} {{\n    server unix:{socket};\n    keepalive {keepalive};\n"
            f"    keepalive_requests 1000000000;\n    keepalive_time {timeout};\n    keepalive_timeout 1h;\n  }}\n"
        )

    def unavailable(name: str, text: str) -> str:
        # A trailers-only gRPC answer: HTTP 200, content-type application/grpc and grpc-status in
        # one HEADERS frame that ends the stream (grpc-go reads grpc-status only from a 200).
        return (
            f"    location @{name} {{\n      default_type application/grpc;\n"
            f'      add_header grpc-status 14 always;\n      add_header grpc-message "{text}" always;\n'
            f'      return 200 "";\n    }}\n'
        )

    if settings.nginx_version >= (1, 25, 1):
        listen_http2 = f"    listen unix:{listen};\n    http2 on;\n"
    else:  # before 1.25.1 HTTP/2 is a parameter of listen
        listen_http2 = f"    listen unix:{listen} http2;\n"
    hooked = "".join(
        f"    location = {method} {{\n      grpc_pass grpc://hook;\n      error_page 502 504 = @hook_down;\n    }}\n"
        for method in sorted(HOOKED_METHODS)
    )
    return (
        "# Written by the elasticgpu agent (elasticgpu/agent/cri/front.py) at each start; edits are lost.\n"
        "daemon off;\n"
        "master_process off;  # one process: no user switch, nothing orphaned by a kill -9\n"
        f"pid {state}/nginx.pid;\n"
        "error_log stderr warn;\n"
        "events {\n  worker_connections 1024;  # kubelet: one connection, plus one upstream per call in flight\n}\n"
        "http {\n"
        "  access_log off;\n"
        "  server_tokens off;\n"
        f"  client_body_temp_path {state}/body;\n  proxy_temp_path {state}/proxy;\n"
        f"  fastcgi_temp_path {state}/fastcgi;\n  uwsgi_temp_path {state}/uwsgi;\n  scgi_temp_path {state}/scgi;\n"
        "  client_max_body_size 0;  # no limit of ours: the runtime's own applies\n"
        "  large_client_header_buffers 4 64k;\n"
        "  http2_max_concurrent_streams 1024;\n"
        # kubelet keeps one connection for everything: never close it for its age or call count.
        f"  keepalive_requests 1000000000;\n  keepalive_time {timeout};\n  keepalive_timeout 1h;\n"
        f"  client_body_timeout {timeout};\n  send_timeout {timeout};\n"
        f"  grpc_read_timeout {timeout};\n  grpc_send_timeout {timeout};\n"
        f"  grpc_connect_timeout {settings.connect_timeout_s}s;\n"
        "  grpc_buffer_size 64k;  # an answer's headers and trailers (a long error message) must fit\n"
        + upstream("runtime", runtime)
        + upstream("hook", hook)
        + "  server {\n"
        + listen_http2
        + hooked
        + "    location / {\n      grpc_pass grpc://runtime;\n      error_page 502 504 = @runtime_down;\n    }\n"
        + unavailable(
            "runtime_down",
            f"elasticgpu CRI front: the container runtime at {runtime} did not answer "
            "(not running, or its answer was unreadable: see the agent's log); retry",
        )
        + unavailable(
            "hook_down",
            f"elasticgpu CRI front: the agent's CRI hook at {hook} did not answer (the "
            "agent is starting or restarting: see its log on this node); retry",
        )
        + "  }\n}\n"
    )


def find_nginx(name: str) -> str | None:
    """The nginx binary `name` (a path, or looked up in PATH) if it has HTTP/2 and gRPC, else None."""
    found = shutil.which(name)
    if found is None:
        return None
    try:
        done = subprocess.run([found, "-V"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    built = done.stderr + done.stdout
    if done.returncode != 0 or "--with-http_v2_module" not in built or "--without-http_grpc_module" in built:
        return None
    return found


def nginx_version(binary: str) -> tuple[int, ...]:
    """The version of an nginx binary (`nginx -v`), e.g. (1, 22, 1); (0,) if it does not say."""
    try:
        done = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return (0,)
    found = re.search(r"nginx/(\d+(?:\.\d+)*)", done.stderr + done.stdout)
    return tuple(int(part) for part in found.group(1).split(".")) if found else (0,)


_death_signal: list[str] | None = None  # the command prefix found by _with_agent_death, once


def _with_agent_death() -> list[str]:
    """`setpriv --pdeathsig KILL --` when it works here, else nothing.

    nginx should die with the agent, even by SIGKILL: a restarted agent starts its own, and an old
    one would keep kubelet's connection. Linux does that for a child that asks (PR_SET_PDEATHSIG,
    sent when the *thread* that started it ends: the CRI hook's thread, which lives as long as
    the agent). Asking from Python needs a preexec_fn, so a plain fork in a process full of grpc
    threads: grpc's fork handlers then run in the child and abort it now and then (seen: nginx
    exited -6, "epoll_wait error: Bad file descriptor"). util-linux's setpriv asks and execs nginx,
    and Popen spawns it without Python code in the child. Without setpriv (not in the image) the
    pid file catches what a killed agent left (`_kill_left_over`)."""
    global _death_signal
    if _death_signal is None:
        found = shutil.which("setpriv")
        command = [found, "--pdeathsig", "KILL", "--"] if found else []
        try:  # an old setpriv (before util-linux 2.33) has no --pdeathsig
            done = subprocess.run([*command, "true"], capture_output=True, timeout=10) if command else None
            works = done is not None and done.returncode == 0
        except (OSError, subprocess.SubprocessError):
            works = False
        _death_signal = command if works else []
    return _death_signal


class NginxFront:
    """One nginx process serving `settings.listen`. `start()`, `alive()`, `socket_intact()`, `stop()`."""

    def __init__(self, settings: FrontSettings) -> None:
        self.settings = settings
        self.bind = bind_path(settings.listen)
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=20)
        self._socket: tuple[int, int] | None = None  # (device, inode) of the socket on listen

    @property
    def pid(self) -> int | None:
        """nginx's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Write the config, start nginx, wait until it listens, move its socket onto `listen`.

        On failure nothing is left running and `listen` is untouched; raises `FrontError`."""
        s = self.settings
        config = render_config(s, bind=self.bind)
        if (s.listen.exists() or s.listen.is_symlink()) and not stat.S_ISSOCK(s.listen.lstat().st_mode):
            raise FrontError(f"{s.listen} exists and is not a socket; choose another --cri-listen or remove it")
        for folder in (s.state_dir, self.bind.parent):
            folder.mkdir(parents=True, exist_ok=True)
            os.chmod(folder, 0o700)
        conf = s.state_dir / "nginx.conf"
        self._kill_left_over(conf)
        with contextlib.suppress(FileNotFoundError):
            self.bind.unlink()  # left by an nginx that was killed
        tmp = conf.with_suffix(".tmp")
        tmp.write_text(config)
        os.replace(tmp, conf)
        try:
            # No preexec_fn (see _with_agent_death): Popen spawns without running Python in the child.
            self._process = subprocess.Popen(
                [*_with_agent_death(), s.nginx, "-e", "stderr", "-p", f"{s.state_dir}/", "-c", str(conf)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
        except OSError as e:
            raise FrontError(f"cannot run nginx {s.nginx!r} ({e}); install nginx or set --cri-nginx") from None
        self._lines.clear()
        self._reader = threading.Thread(target=self._read_log, args=(self._process,), name="cri-front-log",
                                        daemon=True)  # fmt: skip
        self._reader.start()
        try:
            self._wait_listening()
            os.chmod(self.bind, 0o600)
            linked = s.listen.parent / f".{s.listen.name}.{os.getpid()}.tmp"
            with contextlib.suppress(FileNotFoundError):
                linked.unlink()
            os.link(self.bind, linked)
            os.replace(linked, s.listen)
            found = os.lstat(s.listen)
            self._socket = (found.st_dev, found.st_ino)
        except BaseException:
            self.stop()
            raise
        log.info("CRI front: nginx (pid %d) listens on %s", self._process.pid, s.listen)

    def _kill_left_over(self, conf: Path) -> None:
        """SIGKILL an nginx of this front that outlived its agent (its pid file names it, and it
        runs our config file): it would keep serving kubelet's open connection."""
        try:
            pid = int((self.settings.state_dir / "nginx.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            return
        if str(conf).encode() not in command:
            return  # the pid now belongs to another process
        log.warning("killing nginx (pid %d) left running by an earlier agent with %s", pid, conf)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + self.settings.stop_timeout_s
        while time.monotonic() < deadline:
            try:  # gone, or a zombie (its sockets are closed then)
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    return
            except (OSError, IndexError):
                return
            time.sleep(0.01)

    def _wait_listening(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.settings.start_timeout_s
        while True:
            code = self._process.poll()
            if code is not None:
                if self._reader is not None:
                    self._reader.join(1)
                raise FrontError(
                    f"nginx {self.settings.nginx} exited with code {code} at start: "
                    + (" | ".join(self._lines) or "no output")
                )
            if self._listening():
                return
            if time.monotonic() > deadline:
                raise FrontError(
                    f"nginx did not listen on {self.bind} within {self.settings.start_timeout_s:g} s: "
                    + (" | ".join(self._lines) or "no output")
                )
            time.sleep(0.01)

    def _listening(self) -> bool:
        # nginx binds, then makes the socket 0666, then listens: a connect that succeeds comes after
        # its chmod, so ours (0600) is not undone. (Seen: the file's mere existence was too early.)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.bind))
            except OSError:
                return False
        return True

    def _read_log(self, process: subprocess.Popen[bytes]) -> None:
        """nginx's error log (its stderr) into ours, line by line, until it exits. An upstream
        that is down makes nginx log every call kubelet makes (several a second): the same
        problem is logged once per `LOG_REPEAT_S`, with the count of the lines left out."""
        assert process.stderr is not None
        last: dict[str, tuple[float, int]] = {}  # problem -> (when logged, lines left out since)
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            self._lines.append(line)
            key, now = log_problem(line), time.monotonic()
            logged, left_out = last.get(key, (-LOG_REPEAT_S, 0))
            if now - logged < LOG_REPEAT_S:
                last[key] = (logged, left_out + 1)
                continue
            if len(last) > 1000:  # endless distinct problems grow nothing
                last.clear()
            last[key] = (now, 0)
            more = f" ({left_out} more like it in the last {now - logged:.0f} s)" if left_out else ""
            log.warning("nginx: %s%s", line, more)

    def alive(self) -> bool:
        """nginx is running."""
        return self._process is not None and self._process.poll() is None

    def exit_code(self) -> int | None:
        """nginx's exit status once it exited (negative: killed by that signal), else None."""
        return self._process.poll() if self._process is not None else None

    def socket_intact(self) -> bool:
        """`listen` is still the socket this front put there (not removed or replaced)."""
        try:
            found = os.lstat(self.settings.listen)
        except FileNotFoundError:
            return False
        return stat.S_ISSOCK(found.st_mode) and (found.st_dev, found.st_ino) == self._socket

    def stop(self) -> None:
        """SIGTERM nginx (calls in flight are cut: kubelet retries), SIGKILL it after
        `stop_timeout_s`, remove its sockets. Idempotent."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
                try:
                    process.wait(self.settings.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(self.settings.stop_timeout_s)
            if self._reader is not None:
                self._reader.join(self.settings.stop_timeout_s)
            if process.stderr is not None:
                process.stderr.close()
        if self._socket is not None and self.socket_intact():
            with contextlib.suppress(FileNotFoundError):
                self.settings.listen.unlink()
        self._socket = None
        with contextlib.suppress(FileNotFoundError):
            self.bind.unlink()
