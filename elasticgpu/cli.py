"""The `elasticgpu` command line: one subcommand per job that really works."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from elasticgpu import __version__, flags, plan, user_errors

DEFAULT_HEALTH_PORT = 8080


def _crds(args: argparse.Namespace) -> int:
    from elasticgpu.api import crd

    documents = crd.all_crds()
    if args.write:
        target = Path(args.write)
        target.mkdir(parents=True, exist_ok=True)
        for file_name, text in documents.items():
            (target / file_name).write_text(text)
            print(f"wrote {target / file_name}")
        return 0
    if args.apply:
        from elasticgpu.crd_installer import apply_crds

        for line in apply_crds(kubeconfig=args.kubeconfig, context=args.context):
            print(line)
        return 0
    sys.stdout.write("---\n".join(documents.values()))
    return 0


def _controller(args: argparse.Namespace) -> int:
    import os

    from elasticgpu.controller.edge.leader import LeaderSettings
    from elasticgpu.controller.process import startup
    from elasticgpu.logs import configure_logging

    configure_logging(level=flags.log_level(args), log_format=args.log_format)
    # The Lease lives where the controller runs (the Downward API's POD_NAMESPACE), else in the
    # one namespace it watches, else in kube-system.
    lease_namespace = args.leader_elect_namespace or os.environ.get("POD_NAMESPACE") or args.namespace or "kube-system"
    try:
        leader = LeaderSettings(enabled=args.leader_elect, namespace=lease_namespace, name=args.leader_elect_name,
                                lease_duration_s=args.leader_elect_lease_duration,
                                renew_deadline_s=args.leader_elect_renew_deadline,
                                retry_period_s=args.leader_elect_retry_period)
    except ValueError as err:  # the three periods disagree: name the flags, not the fields
        raise SystemExit(f"elasticgpu controller: --leader-elect-lease-duration, --leader-elect-renew-deadline, "
                         f"--leader-elect-retry-period: {err}") from None
    address = health_address(args)
    startup.run_controller(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace, leader=leader,
                           health_port=None if address is None else address.port,
                           health_host=address.host if address else "0.0.0.0")
    return 0


def health_address(args: argparse.Namespace) -> flags.BindAddress | None:
    """The one listener of /healthz, /readyz and /metrics: --health-probe-bind-address and
    --metrics-bind-address name it (they must agree when both are given), --health-port is the old
    spelling of its port (-1: none)."""
    given: dict[str, flags.BindAddress | None] = {
        flag: getattr(args, flag)
        for flag in ("health_probe_bind_address", "metrics_bind_address")
        if getattr(args, flag) is not flags.UNSET
    }
    if len(set(given.values())) > 1:
        raise user_errors.UserError(
            "--health-probe-bind-address and --metrics-bind-address differ, but one server serves /healthz,"
            " /readyz and /metrics: give one of them, or the same address to both"
        )
    if given:
        return next(iter(given.values()))
    if args.health_port is not None:
        return None if args.health_port < 0 else flags.BindAddress(host="0.0.0.0", port=args.health_port)
    return flags.BindAddress(host="0.0.0.0", port=DEFAULT_HEALTH_PORT)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="elasticgpu", description="Claim GPUs in Kubernetes like storage.")
    parser.add_argument("--version", action="version", version=f"elasticgpu {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    crds = commands.add_parser("crds", help="print, write or apply the CustomResourceDefinitions")
    mode = crds.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="DIR", help="write one YAML file per CRD into DIR")
    mode.add_argument("--apply", action="store_true", help="apply them to the cluster (server-side apply)")
    crds.add_argument("--kubeconfig", help="kubeconfig for --apply (default: $KUBECONFIG or ~/.kube/config)")
    crds.add_argument("--context", help="kubeconfig context for --apply")
    crds.set_defaults(handler=_crds)

    plan_text = "bind claims to GPUs offline, with no cluster, and show the result and the reasons"
    plan_parser = commands.add_parser(
        "plan", help=plan_text,
        description=f"{plan_text[0].upper()}{plan_text[1:]}: the same allocator, classes and quotas as the"
        " controller, on GPU objects or a short node list; unknown fields are refused as `kubectl apply` does.",
    )
    plan.add_arguments(plan_parser)
    plan_parser.set_defaults(handler=plan.run)

    from elasticgpu.controller.settings import ControllerSettings

    controller = commands.add_parser("controller", help="run the controller that binds claims (blocking)",
                                     epilog=ControllerSettings.environment_help())
    controller.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG, ~/.kube/config)")
    controller.add_argument("--context", help="kubeconfig context")
    controller.add_argument("--namespace", help="watch claims of this namespace only (default: all)")
    flags.add_logging(controller)
    flags.add_switch(controller, "leader-elect", default=True,
                     text="bind only while holding the leader Lease (default: on; =false only for one replica)")
    controller.add_argument("--leader-elect-namespace",
                            help="namespace of the Lease (default: $POD_NAMESPACE, else --namespace, else kube-system)")
    controller.add_argument("--leader-elect-name", default="elasticgpu-controller", help="name of the Lease")
    from elasticgpu.controller.edge.leader import LeaderSettings

    periods = LeaderSettings()
    controller.add_argument("--leader-elect-lease-duration", type=flags.seconds, default=periods.lease_duration_s,
                            help="seconds after the leader's last renewal before a standby takes over (default"
                            f" {periods.lease_duration_s:g}s)")
    controller.add_argument("--leader-elect-renew-deadline", type=flags.seconds, default=periods.renew_deadline_s,
                            help="seconds a leader keeps trying to renew before it steps down (default"
                            f" {periods.renew_deadline_s:g}s; less than the lease duration minus the retry period)")
    controller.add_argument("--leader-elect-retry-period", type=flags.seconds, default=periods.retry_period_s,
                            help=f"seconds between renewals and between a standby's tries (default"
                            f" {periods.retry_period_s:g}s)")
    for flag in ("--health-probe-bind-address", "--metrics-bind-address"):
        controller.add_argument(flag, type=flags.bind_address, default=flags.UNSET,
                                help=f"[host]:port of /healthz, /readyz and /metrics, one server"
                                f" (default :{DEFAULT_HEALTH_PORT}; 0: off)")
    controller.add_argument("--health-port", type=int, default=None,
                            help="the same server's port, older spelling (0: any free port; -1: off)")
    controller.set_defaults(handler=_controller)

    from elasticgpu.agent import commands as agent_commands

    agent = commands.add_parser("agent", help="the node agent: run it, or migrate its ledger (db upgrade|current)")
    agent_commands.add_arguments(agent)

    from elasticgpu.controller.admission import commands as webhook_commands

    webhook = commands.add_parser("webhook", help="run the pod admission webhook over HTTPS (blocking)")
    webhook_commands.add_arguments(webhook)

    from elasticgpu import after_uninstall

    after_uninstall.add_arguments(commands.add_parser(
        "after-uninstall", help="remove what the product made at run time (helm uninstall's post-delete hook)",
        description=(after_uninstall.__doc__ or "").split("\n\n")[1].replace("\n", " ")))

    from elasticgpu import demo

    demo_text = "see it work: a local API server, the controller, webhook and simulated agents, a few claims"
    demo.add_arguments(commands.add_parser(
        "demo", help=demo_text,
        description="See it work, on this machine, in one command: the project's local API server (or"
        " --kubeconfig's cluster), the controller, the webhook and two simulated node agents; a slice claim,"
        " a whole card, an inline request and one that cannot fit; what each container sees; all cleaned up"
        " after. Exit 0 when every claim reached its container."))
    demo.add_sandbox_arguments(commands.add_parser(
        "sandbox", help="keep the demo's cluster to try things in: sandbox up | status | down",
        description="The demo's cluster (API server, simulated nodes and cards, agents, controller, webhook,"
        " the default class gpushare), kept in the background for your own claims, pods and `kubectl egpu`;"
        " `sandbox down` stops all of it."))
    return parser


EXIT_NOTE_ENV = "ELASTICGPU_EXIT_NOTE"
"""A note to print last, on stderr, whatever the command's outcome: scripts/run.sh's word on how to get
`elasticgpu` on PATH (run.sh execs the command, so that signals reach it, and cannot speak after it).
Taken out of the environment first, so that no child process (the demo's controller, agents) repeats it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `elasticgpu` console script."""
    note = os.environ.pop(EXIT_NOTE_ENV, None)
    try:
        args = build_parser().parse_args(argv)
        return user_errors.guarded(args.handler, prog=f"elasticgpu {args.command}")(args)
    except KeyboardInterrupt:
        # Ctrl-C where no command handles it (imports, start-up): one line and the shell's 128+SIGINT,
        # not a traceback through whatever module was loading. `demo` handles its own (demo/running.py).
        print("elasticgpu: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if note:
            print(note, file=sys.stderr)


EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C, as shells give a command killed by SIGINT (128 + 2)."""


if __name__ == "__main__":
    raise SystemExit(main())
