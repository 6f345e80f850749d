"""The `kubectl-egpu` console script: flags, subcommands, and the error boundary around them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from elasticgpu import __version__, user_errors
from elasticgpu.kubectl_plugin import cluster, doctor, handover, plan, release, top, usage, why

ClusterHandler = Callable[[argparse.Namespace, cluster.Cluster], int]


def _common(parser: argparse.ArgumentParser, *, default: object = None) -> None:
    """kubectl's own spelling of the connection flags (kubectl does not pass its own to plugins).

    They are taken before the subcommand (`kubectl egpu -n team why c1`, as kubectl users type
    them) and after it; a subcommand's flags default to `argparse.SUPPRESS`, so that a value
    given before it is not reset by the subcommand's default."""
    parser.add_argument("-n", "--namespace", default=default,
                        help="namespace of the claims (default: the context's, else default)")
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", default=default, help="kubeconfig context (default: the current one)")


def _connected(handler: ClusterHandler) -> Callable[[argparse.Namespace], int]:
    """`handler` given the cluster the flags name (connecting inside the boundary, so a bad
    kubeconfig is told in one line)."""

    def call(args: argparse.Namespace) -> int:
        view = cluster.Cluster.connect(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
        return handler(args, view)

    return call


def build_parser() -> argparse.ArgumentParser:
    """The parser of `kubectl egpu` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="kubectl egpu",
        description="See elasticgpu's GPUs and claims: top, why CLAIM, usage, plan; release --force EGPU, handover"
                    " NODE, doctor NODE (admin).",
    )
    parser.add_argument("--version", action="version", version=f"kubectl-egpu {__version__}")
    _common(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    connected = (  # the subcommands that read the cluster: (name, help, module with add_arguments and run)
        ("top", "per node and card: reserved, used, health, claims", top),
        ("why", "why a claim is Pending (or Bound, or Lost), and what it lacks", why),
        ("release", "--force: free an ElasticGPU's reservation its node's agent still reports in use (admin)",
         release),
        ("usage", "per namespace and class: reserved, used and waste (from Prometheus, or the objects now)", usage),
        ("handover", "move a node between the device plugin and elasticgpu, either way (admin)", handover),
        ("doctor", "a node's checks: opted in, allocator conflicts, cards, node hook, toolkit setting", doctor),
    )
    for name, summary, module in connected:
        sub = commands.add_parser(name, help=summary)
        _common(sub, default=argparse.SUPPRESS)
        module.add_arguments(sub)
        sub.set_defaults(handler=_connected(module.run))

    plan_parser = commands.add_parser("plan", help="bind claims offline, with no cluster (elasticgpu plan)")
    plan.add_arguments(plan_parser)
    plan_parser.set_defaults(handler=plan.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kubectl-egpu` console script (kubectl runs it for `kubectl egpu`)."""
    args = build_parser().parse_args(argv)
    try:
        return user_errors.guarded(args.handler, prog=f"kubectl egpu {args.command}")(args)
    except BrokenPipeError:
        # `kubectl egpu top | head`: the reader left; no traceback, and none at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
