"""`elasticgpu agent ...`: the agent's subcommands (`run`, `db upgrade|downgrade|current|history`)."""

from __future__ import annotations

import argparse
import sys

from elasticgpu.agent import errors, settings


def _db(args: argparse.Namespace) -> int:
    from elasticgpu.agent.ledger import store

    if args.db_command == "history":
        for revision, down, doc in store.history():
            print(f"{down or '<base>'} -> {revision}{' (head)' if revision == store.head_revision() else ''}: {doc}")
        return 0
    url = settings.from_sources(args).ledger.ledger_url
    if args.db_command == "current" and (missing := store.missing_file(url)) is not None:
        # Looking must not create: an empty file here would be the ledger the agent then finds.
        # No ledger is a state (a node whose agent never ran), not an error: exit 0, as for an empty one.
        print(f"no ledger at {missing} (<base>: the agent creates it when it starts)")
        return 0
    engine = store.make_engine(url)
    try:
        if args.db_command == "current":
            current = store.current_revision(engine)
            head = store.head_revision()
            state = "empty" if current is None else ("head" if current == head else f"behind head {head}")
            print(f"{current or '<base>'} ({state})")
        elif args.db_command == "upgrade":
            before, after = store.upgrade(engine, url)
            print(f"{before or '<base>'} -> {after}")
        else:
            before, after_down = store.downgrade(engine, url, args.revision)
            print(f"{before or '<base>'} -> {after_down or '<base>'}")
    finally:
        engine.dispose()
    return 0


def _run(args: argparse.Namespace) -> int:
    from elasticgpu.agent.running import main as run_agent

    return run_agent(settings.from_sources(args), log_level=str(args.log_level))


def _mps_daemons(args: argparse.Namespace) -> int:
    from elasticgpu.agent import mps_serving
    from elasticgpu.logs import configure_logging

    configure_logging(level=str(args.log_level))
    return mps_serving.serve(settings.from_sources(args))


def _guarded(handler: object) -> object:
    def call(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))  # type: ignore[operator]
        except errors.AgentError as e:
            # What the operator must fix, in one line, never a stack trace.
            print(f"elasticgpu agent: {e}", file=sys.stderr)
            return 2
        except ValueError as e:  # a setting that does not parse
            print(f"elasticgpu agent: {e}", file=sys.stderr)
            return 2

    return call


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `agent` subcommand's own subcommands."""
    commands = parser.add_subparsers(dest="agent_command", required=True)

    run = commands.add_parser(
        "run", help="run the node agent (blocking): discovery, GPU objects, health, usage, metrics",
        description="Run the node agent. Every setting is a flag and an ELASTICGPU_AGENT_* environment variable."
        " With --backend simulated, the state paths not given (--ledger-url, --device-dir, --cdi-dir,"
        " --cri-front-dir, --limits-dir, --cri-listen) default under $TMPDIR/elasticgpu-sim-<uid>/<node-name> (/tmp"
        " without TMPDIR): no root needed, nothing under /var or /run touched, and two simulated nodes on one"
        " machine never share a socket, ledger or CDI file.",
    )
    run.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    settings.add_arguments(run)
    run.set_defaults(handler=_guarded(_run))

    mps = commands.add_parser(
        "mps-daemons", help="run the node's MPS control daemons outside the agent (blocking; DaemonSet elasticgpu-mps)",
        description="Run the node's MPS control daemons and answer the agent's requests on --mps-daemons-socket"
        " (default: mps-daemons.sock in --isolation-dir), so that an agent restart leaves them and their clients"
        " alone (docs/isolation.md). Takes the agent's settings: the same flags and ELASTICGPU_AGENT_* variables.",
    )
    mps.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    settings.add_arguments(mps, concerns=("cri", "isolation"))
    mps.set_defaults(handler=_guarded(_mps_daemons))

    db = commands.add_parser("db", help="migrate or inspect the agent's ledger database (Alembic)")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    for name, text in (
        ("upgrade", "migrate the ledger to the newest revision this agent knows"),
        ("current", "print the ledger's revision"),
        ("history", "list the revisions this agent knows"),
        ("downgrade", "migrate the ledger down to REVISION (-1: one step, base: empty)"),
    ):
        sub = db_commands.add_parser(name, help=text)
        if name != "history":
            sub.add_argument(
                "--ledger-url", dest="ledger_url", default=None,
                help=f"env {settings._env('ledger_url')}; default {settings.DEFAULT_LEDGER_URL!r}",
            )
        if name == "downgrade":
            sub.add_argument("revision", help="target revision, -1 for one step, base for empty")
        sub.set_defaults(handler=_guarded(_db))
