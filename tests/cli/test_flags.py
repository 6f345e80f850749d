"""The controller-runtime spellings of the long-running commands' flags (issue 18)."""

from __future__ import annotations

import argparse

import pytest

from elasticgpu import cli, flags


def _controller(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["controller", *argv])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [((), True), (("--leader-elect",), True), (("--leader-elect=false",), False), (("--leader-elect=true",), True),
     (("--no-leader-elect",), False), (("--leader-elect", "0"), False)],
)  # fmt: skip
def test_leader_elect_reads_like_go_flags(argv: tuple[str, ...], expected: bool) -> None:
    assert _controller(*argv).leader_elect is expected


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), flags.BindAddress("0.0.0.0", cli.DEFAULT_HEALTH_PORT)),
        (("--health-probe-bind-address", ":8081"), flags.BindAddress("0.0.0.0", 8081)),
        (("--metrics-bind-address", "127.0.0.1:9090"), flags.BindAddress("127.0.0.1", 9090)),
        (("--metrics-bind-address", "[::1]:9090"), flags.BindAddress("::1", 9090)),
        (("--metrics-bind-address", "0"), None),
        (("--health-port", "-1"), None),
        (("--health-port", "9000"), flags.BindAddress("0.0.0.0", 9000)),
    ],
)
def test_one_listener_for_probes_and_metrics(argv: tuple[str, ...], expected: flags.BindAddress | None) -> None:
    assert cli.health_address(_controller(*argv)) == expected


def test_two_different_addresses_are_refused_with_the_reason() -> None:
    args = _controller("--health-probe-bind-address", ":8081", "--metrics-bind-address", ":8080")
    with pytest.raises(cli.user_errors.UserError, match="one server serves"):
        cli.health_address(args)


@pytest.mark.parametrize("text", ["8080", "host:http", ":70000"])
def test_a_bad_bind_address_is_refused_by_the_parser(text: str) -> None:
    with pytest.raises(SystemExit) as exited:
        _controller("--metrics-bind-address", text)
    assert exited.value.code == 2


def test_v_means_debug() -> None:
    assert flags.log_level(_controller("-v", "2")) == "debug"
    assert flags.log_level(_controller("--log-level", "warning")) == "warning"
