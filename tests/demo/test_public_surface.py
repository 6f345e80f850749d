"""The public surface of elasticgpu.demo is what the command line wires, and building the parser
does not import the demo's run (its grpc, rich, agent and CRI imports): other subcommands start without it."""

from __future__ import annotations

import subprocess
import sys

import elasticgpu.demo as demo


def test_exports_are_exactly_the_public_names() -> None:
    assert demo.__all__ == ["add_arguments", "add_sandbox_arguments", "run", "run_sandbox"]
    for name in demo.__all__:
        assert callable(getattr(demo, name))


def test_the_command_line_imports_the_demo_only_when_it_runs() -> None:
    probe = (
        "import sys; from elasticgpu import cli; cli.build_parser(); "
        "print(sorted(m for m in ('elasticgpu.demo.running', 'elasticgpu.demo.containers',"
        " 'elasticgpu.demo.sandbox') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
