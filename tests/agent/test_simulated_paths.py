"""`elasticgpu agent run --backend simulated` with no path flags keeps its state in a per-user folder,
never under /var or /run (which need root and would touch a real node's runtime, /var/run/cdi);
explicit flags and variables still win; the nvml backend keeps the node's defaults (issue 18)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from elasticgpu.agent import settings
from elasticgpu.cli import build_parser

# The state the agent writes. Not cri_upstream: the runtime's own socket, which the agent only connects to.
STATE = {
    "ledger": ("ledger_url",),
    "discovery": ("device_dir",),
    "cri": ("cdi_dir", "cri_front_dir", "limits_dir", "cri_listen"),
    "isolation": ("isolation_dir",),
    "take_over": ("device_plugin_dir",),
    "dra": ("dra_checkpoint",),
}


def _resolved(*argv: str, environ: dict[str, str] | None = None) -> settings.AgentSettings:
    return settings.from_sources(build_parser().parse_args(["agent", "run", *argv]), environ=environ or {})


def _paths(built: settings.AgentSettings) -> dict[str, str]:
    out = {}
    for concern, names in STATE.items():
        part = getattr(built, concern)
        for name in names:
            out[name] = str(getattr(part, name)).removeprefix("sqlite:///")
    return out


def _under_system(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in ("/var", "/run"))


def test_simulated_state_is_per_user_and_never_under_var_or_run() -> None:
    paths = _paths(_resolved("--backend", "simulated", "--node-name", "node-a"))
    assert set(paths) == set(settings.SIMULATED_STATE), "the test covers every path the defaults move"
    assert not [p for p in paths.values() if _under_system(p)], paths
    home = f"/tmp/elasticgpu-sim-{os.getuid()}/node-a"
    assert all(p.startswith(home + "/") for p in paths.values()), paths
    assert len(set(paths.values())) == len(paths), "each path its own"


def test_tmpdir_moves_it_and_the_environment_also_selects_the_backend() -> None:
    built = _resolved(environ={"ELASTICGPU_AGENT_BACKEND": "simulated", "TMPDIR": "/scratch", "NODE_NAME": "n1"})
    assert built.cri.cdi_dir == f"/scratch/elasticgpu-sim-{os.getuid()}/n1/cdi"
    assert built.ledger.ledger_url == f"sqlite:////scratch/elasticgpu-sim-{os.getuid()}/n1/ledger.db"


def test_two_simulated_nodes_on_one_machine_share_no_path() -> None:
    """Issue 36: the defaults were per user, so a second simulated agent took the first's CRI socket,
    ledger and CDI file without a word."""
    a = _paths(_resolved("--backend", "simulated", "--node-name", "node-a"))
    b = _paths(_resolved("--backend", "simulated", environ={"NODE_NAME": "node-b"}))
    assert not set(a.values()) & set(b.values()), (a, b)
    long_name = "n" * 63  # the longest node name: its socket path must still fit a unix socket's 107 bytes
    socket = _paths(_resolved("--backend", "simulated", "--node-name", long_name))["cri_listen"]
    assert len(socket.encode()) < 108 and long_name[:31] in socket, socket


def test_a_path_given_by_flag_or_variable_wins() -> None:
    built = _resolved("--backend", "simulated", "--cdi-dir", "/var/run/cdi", "--limits-dir", "",
                      environ={"ELASTICGPU_AGENT_LEDGER_URL": "sqlite:////var/lib/x.db"})  # fmt: skip
    assert built.cri.cdi_dir == "/var/run/cdi" and built.cri.limits_dir == ""
    assert built.ledger.ledger_url == "sqlite:////var/lib/x.db"
    assert not _under_system(built.cri.cri_listen)


def test_the_nvml_backend_keeps_the_node_defaults() -> None:
    built = _resolved()
    defaults = settings.AgentSettings()
    assert built == defaults
    assert built.cri.cdi_dir == "/var/run/cdi" and built.ledger.ledger_url == settings.DEFAULT_LEDGER_URL
    assert dataclasses.replace(_resolved("--backend", "nvml"), discovery=defaults.discovery) == defaults


def test_help_says_where_a_simulated_agent_keeps_its_state(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["agent", "run", "--help"])
    assert "default under $TMPDIR/elasticgpu-sim-<uid>/<node-name>" in " ".join(capsys.readouterr().out.split())
