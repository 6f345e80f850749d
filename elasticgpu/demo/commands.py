"""`elasticgpu demo`'s flags; the run itself (`running`) is imported only when the demo runs, so that
every other subcommand starts without the demo's imports (grpc, rich)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Handler of `elasticgpu demo` (see `running.run`)."""
    from elasticgpu.demo import running

    return running.run(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `elasticgpu demo`."""
    parser.add_argument(
        "--kubeconfig",
        help="run against this cluster instead of a local API server "
        "(a namespace and simulated nodes of its own, deleted after; its API server must "
        "reach this host's 127.0.0.1 for the webhook: not kind or k3d, docs/sandbox.md)",
    )
    parser.add_argument("--context", help="kubeconfig context (with --kubeconfig)")
    parser.add_argument(
        "--cluster",
        choices=("local", "real"),
        default="local",
        help="the cluster the demo starts itself (without --kubeconfig): `local`, the project's test API "
        "server (no scheduler, no kubelet); `real`, Kubernetes' own kube-apiserver, "
        "controller manager and scheduler (Node,RBAC, NodeRestriction; the scheduler places the ungated pods), "
        "the binary of `bash testcluster/build.sh` (a cold build takes ~16 min; see testcluster/README.md)",
    )
    parser.add_argument(
        "--install",
        choices=("processes", "chart"),
        default="processes",
        help="how the product runs: `processes` (default), the controller, webhook and agents as processes of "
        "this machine; `chart` (with --cluster real; root), `helm install` of deploy/chart on a one-node "
        "Kubernetes with kubelet, containerd and a pod network in a network namespace of its own (the box), "
        "the product image imported without a registry, the claims' pods real busybox pods; then helm "
        "uninstall and the box removed (needs the builds of testcluster/, testruntime/, testnetwork/, "
        "testhelm/ and image/)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=90.0,
        help="seconds each wait may take (binding, gates, containers; default 90)",
    )
    parser.add_argument(
        "--no-runtime",
        action="store_true",
        help="do not start the test containerd even where it could run: show the agent's decisions",
    )
    parser.add_argument(
        "--no-agent",
        action="store_true",
        help="start no node agent (to see the demo fail: no card appears, no claim binds)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs) and print where it is")
    parser.set_defaults(handler=run)


def run_sandbox(args: argparse.Namespace) -> int:
    """Handler of `elasticgpu sandbox` (see `sandbox`)."""
    from elasticgpu.demo import sandbox

    handler = {"up": sandbox.up, "down": sandbox.down, "status": sandbox.status, "serve": sandbox.serve}
    return handler[args.action](args)


def add_sandbox_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `elasticgpu sandbox up | status | down`."""
    actions = parser.add_subparsers(dest="action", required=True, metavar="{up,status,down}")
    up = actions.add_parser("up", help="start the demo's cluster in the background and keep it: nodes of simulated"
                            " cards, their agents, the controller, the webhook, the default class gpushare")
    hidden = actions.add_parser("serve")  # the background process `up` starts: not for typing
    for command in (up, hidden):
        command.add_argument("--cluster", choices=("local", "real"), default="local",
                             help="`local`: the project's local API server (default); `real`: Kubernetes' own"
                             " kube-apiserver, controller manager and scheduler (bash testcluster/build.sh once)")
        command.add_argument("--install", choices=("processes", "chart"), default="processes",
                             help="`processes` (default): the demo's controller, webhook and agents as processes;"
                             " `chart` (with --cluster real; root): the chart demo's box kept, deploy/chart installed"
                             " by helm, pods that really run (the builds of testcluster/, testruntime/,"
                             " testnetwork/, testhelm/ and image/)")
        command.add_argument("--timeout-s", type=float, default=90.0, help="seconds each start-up wait may take")
        command.add_argument("--no-runtime", action="store_true",
                             help="do not start the test containerd behind the agents even where it could run")
    actions.add_parser("status", help="whether a sandbox is up, and its KUBECONFIG (exit 1 when none is)")
    actions.add_parser("down", help="stop the sandbox and everything it started; remove its files")
    parser.set_defaults(handler=run_sandbox)
