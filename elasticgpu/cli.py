"""The `elasticgpu` command line: one subcommand per job that really works."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from elasticgpu import __version__, plan


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
    import logging

    from elasticgpu.controller import run_controller

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    run_controller(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
    return 0


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

    plan_parser = commands.add_parser(
        "plan", help="bind claims to GPUs offline, with no cluster, and show the result and the reasons"
    )
    plan.add_arguments(plan_parser)
    plan_parser.set_defaults(handler=plan.run)

    from elasticgpu.controller.settings import ControllerSettings

    controller = commands.add_parser("controller", help="run the controller that binds claims (blocking)",
                                     epilog=ControllerSettings.environment_help())
    controller.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then $KUBECONFIG, ~/.kube/config)")
    controller.add_argument("--context", help="kubeconfig context")
    controller.add_argument("--namespace", help="watch claims of this namespace only (default: all)")
    controller.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    controller.set_defaults(handler=_controller)

    from elasticgpu.agent import commands as agent_commands

    agent = commands.add_parser("agent", help="the node agent: run it, or migrate its ledger (db upgrade|current)")
    agent_commands.add_arguments(agent)

    from elasticgpu.controller.admission import commands as webhook_commands

    webhook = commands.add_parser("webhook", help="run the pod admission webhook over HTTPS (blocking)")
    webhook_commands.add_arguments(webhook)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `elasticgpu` console script."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
