"""Flags that every long-running command spells as controller-runtime does, so a platform team's
manifests and habits carry over: `--health-probe-bind-address`, `--metrics-bind-address`,
`--leader-elect[=false]`, `--log-format`, `-v`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from elasticgpu.user_errors import port_number

LOG_LEVELS = ("debug", "info", "warning", "error")
TRUE_WORDS = frozenset({"true", "t", "yes", "y", "on", "1"})
FALSE_WORDS = frozenset({"false", "f", "no", "n", "off", "0"})


UNSET: object = object()
"""Default of a flag whose absence must be told apart from any value it can take."""


@dataclass(frozen=True)
class BindAddress:
    """Where to listen: `host:port` as controller-runtime writes it (`:8080` all addresses)."""

    host: str
    port: int


def bind_address(text: str) -> BindAddress | None:
    """argparse type of a bind address: `:8080`, `127.0.0.1:8080`, `[::1]:8080`, or `0` for off."""
    text = text.strip()
    if text == "0":
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not host:port (e.g. :8080 or 127.0.0.1:8080; 0 for off)")
    host = host.strip("[]") or "0.0.0.0"
    return BindAddress(host=host, port=port_number(port))


def seconds(text: str) -> float:
    """argparse type of a duration in seconds: `10`, `10s` or `2.5s` (client-go's flags write
    `15s`; minutes and hours are not needed for Lease periods)."""
    number = text.strip().removesuffix("s")
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration in seconds (e.g. 10s or 2.5)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def switch(text: str) -> bool:
    """argparse type of `--flag=true|false` (as Go's flag package reads booleans)."""
    lowered = text.strip().lower()
    if lowered in TRUE_WORDS:
        return True
    if lowered in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_switch(parser: argparse.ArgumentParser, name: str, *, default: bool, text: str) -> None:
    """`--NAME`, `--NAME=true|false` and `--no-NAME`, all setting one boolean."""
    dest = name.replace("-", "_")
    parser.add_argument(f"--{name}", dest=dest, nargs="?", const=True, default=default, type=switch, help=text)
    parser.add_argument(f"--no-{name}", dest=dest, action="store_false", help=f"the same as --{name}=false")


def add_logging(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, `--log-format plain|json` and `-v N` (any N >= 1: debug)."""
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument("--log-format", default="plain", choices=("plain", "json"),
                        help="plain text, or one JSON object per line (default: plain)")
    parser.add_argument("-v", "--v", dest="verbosity", type=int, default=0,
                        help="verbosity as klog counts it: 0 info (default), 1 and more debug")


def log_level(args: argparse.Namespace) -> str:
    """The log level the flags ask for: `-v 1` or more means debug whatever --log-level says."""
    return "debug" if getattr(args, "verbosity", 0) >= 1 else str(args.log_level)
