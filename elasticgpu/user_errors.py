"""The command line's one error boundary: what a user got wrong is told in one line, exit 2.

Every `elasticgpu` subcommand runs inside `guarded`. A mistake of the user's (a kubeconfig that
is missing, unreadable, not YAML or lacks the context; a port in use or out of range; an API
server that does not answer or whose certificate the kubeconfig does not trust; an input file
that is missing or not YAML; a ledger URL SQLAlchemy cannot use) becomes one line on stderr that
names the file, port or server and the fix, never a stack trace. Anything else is a bug of ours
and keeps its traceback.

::

    UserError                   a mistake the user can fix; the message says how
    ├── KubeconfigUnusable      the kubeconfig (or its context) cannot be used
    ├── ServerUnreachable       the API server named in the kubeconfig does not answer
    ├── ServerNotTrusted        TLS: the server's certificate is not signed by the kubeconfig's CA
    ├── PortUnavailable         a port to listen on is in use or not ours to take
    ├── InputFileInvalid        a file given on the command line is missing or not YAML
    ├── ResizeInvalid           `plan --resize` names no claim of the input, or a size it cannot read
    └── LedgerUrlInvalid        the agent's --ledger-url is no database SQLAlchemy can open

Third-party exceptions are translated here and only here (`translate`); the modules that raise
them stay unaware of the command line.
"""

from __future__ import annotations

import argparse
import errno
import os
import ssl
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

EXIT_USAGE = 2
"""Exit code of a user's mistake (as argparse's own): a supervisor must not restart into it."""


class UserError(Exception):
    """A mistake the user can fix; str() is the whole one-line message, fix included."""


class KubeconfigUnusable(UserError):
    """The kubeconfig file, or the context asked for, cannot be used."""


class ServerUnreachable(UserError):
    """The API server does not answer (refused, no route, timeout, name unknown)."""


class ServerNotTrusted(UserError):
    """The API server answered, but TLS failed: its certificate is not trusted by the kubeconfig."""


class PortUnavailable(UserError):
    """A port to listen on is taken by another process or needs privileges."""


class InputFileInvalid(UserError):
    """A file named on the command line is missing, unreadable or not valid YAML."""


class ResizeInvalid(UserError):
    """`elasticgpu plan --resize` names a claim that is not in the input files, or a size it cannot read."""


class LedgerUrlInvalid(UserError):
    """The agent's ledger URL names no database SQLAlchemy can open."""


def port_number(text: str) -> int:
    """argparse type of a port: 0..65535, so a wrong one is refused before anything starts."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0..65535)") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range: use 0..65535 (0: any free port)")
    return value


def kubeconfig_path(args: argparse.Namespace) -> str:
    """The kubeconfig a command reads: --kubeconfig, else $KUBECONFIG, else ~/.kube/config."""
    given = getattr(args, "kubeconfig", None)
    if given:
        return str(given)
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and the errors it was raised from or during, innermost last, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__
    # urllib3 keeps the underlying error as `reason` of MaxRetryError, not as a cause.
    reason = getattr(error, "reason", None)
    if isinstance(reason, BaseException) and id(reason) not in seen:
        yield from _chain(reason)


def _server_of(error: BaseException) -> str:
    pool = getattr(error, "pool", None)
    host, port = getattr(pool, "host", None), getattr(pool, "port", None)
    return f"{host}:{port}" if host else "the API server"


def _ports(args: argparse.Namespace) -> list[str]:
    """Which flags name a port to listen on, with their values: for the message of a taken port."""
    named = []
    for flag in ("health_port", "health_probe_bind_address", "metrics_bind_address", "metrics_port", "port"):
        value = getattr(args, flag, None)
        if isinstance(value, int | str) and value != "":
            named.append(f"--{flag.replace('_', '-')} {value}")
        elif value is not None and hasattr(value, "port"):  # a parsed bind address
            named.append(f"--{flag.replace('_', '-')} {getattr(value, 'host', '')}:{getattr(value, 'port', '')}")
    return named


def translate(error: BaseException, args: argparse.Namespace) -> UserError | None:
    """The user's mistake behind `error`, told with the fix; None when it is no mistake of theirs."""
    if isinstance(error, UserError):
        return error
    config = kubeconfig_path(args)
    chain = list(_chain(error))
    for link in chain:
        kind = type(link).__module__ + "." + type(link).__name__
        if kind.startswith("kubernetes.config") and "ConfigException" in kind:
            return _kubeconfig_error(str(link), config, getattr(args, "context", None))
        if isinstance(link, yaml.YAMLError):
            mark = getattr(link, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            name = getattr(mark, "name", "") or ""
            if name and Path(name) == Path(config):
                return KubeconfigUnusable(
                    f"kubeconfig {config} is not valid YAML{where}: fix the file, or pass --kubeconfig with another"
                )
        if isinstance(link, OSError) and link.filename and str(link.filename) == config:
            why = "does not exist" if isinstance(link, FileNotFoundError) else f"cannot be read ({link.strerror})"
            return KubeconfigUnusable(
                f"kubeconfig {config} {why}: pass --kubeconfig PATH or set KUBECONFIG to a readable kubeconfig"
            )
        if isinstance(link, ssl.SSLError):
            return ServerNotTrusted(
                f"TLS with {_server_of(error)} failed ({getattr(link, 'verify_message', None) or link.reason}):"
                f" the server's certificate is not signed by the certificate-authority of kubeconfig {config};"
                " fix the cluster's certificate-authority-data there (kubectl config view --raw)"
            )
        if isinstance(link, OSError) and link.errno in (errno.EADDRINUSE, errno.EACCES) and _ports(args):
            flags = ", ".join(_ports(args))
            why = "is already in use" if link.errno == errno.EADDRINUSE else "needs privileges (below 1024)"
            return PortUnavailable(f"a port to listen on ({flags}) {why}: choose another port (0: any free port)")
        if kind.startswith("urllib3.exceptions") and kind.endswith(("NewConnectionError", "ConnectTimeoutError")):
            return ServerUnreachable(
                f"the API server {_server_of(error)} does not answer ({type(link).__name__}): check the server"
                f" address in kubeconfig {config} and that the cluster is up (kubectl cluster-info)"
            )
        if kind.startswith("sqlalchemy.exc") and kind.endswith(("ArgumentError", "NoSuchModuleError")):
            url = getattr(args, "ledger_url", None) or "the ledger URL"
            return LedgerUrlInvalid(
                f"--ledger-url {url!r} is not a database URL SQLAlchemy can use ({link}):"
                " e.g. sqlite:////var/lib/elasticgpu/ledger.db"
            )
        if kind.startswith("sqlalchemy.exc") and kind.endswith("OperationalError"):
            url = getattr(args, "ledger_url", None) or "the ledger URL"
            return LedgerUrlInvalid(
                f"the ledger {url!r} cannot be opened ({getattr(link, 'orig', link)}):"
                " its folder must exist and be writable by the agent"
            )
    return None


def _kubeconfig_error(message: str, config: str, context: str | None) -> KubeconfigUnusable:
    if context and "context" in message.lower():
        return KubeconfigUnusable(
            f"kubeconfig {config} has no context {context!r} ({message}):"
            f" `kubectl config get-contexts --kubeconfig {config}` lists the ones it has"
        )
    if not Path(config).exists() and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeconfigUnusable(
            f"no kubeconfig at {config} and not running in a cluster: pass --kubeconfig PATH or set KUBECONFIG"
        )
    return KubeconfigUnusable(
        f"kubeconfig {config} cannot be used ({message}): pass --kubeconfig with a valid kubeconfig"
    )


def guarded(handler: Callable[[argparse.Namespace], int], *, prog: str) -> Callable[[argparse.Namespace], int]:
    """`handler` with the boundary around it: a user's mistake prints one line and returns 2."""

    def call(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except Exception as error:
            told = translate(error, args)
            if told is None:
                raise
            print(f"{prog}: error: {told}", file=sys.stderr)
            return EXIT_USAGE

    return call
