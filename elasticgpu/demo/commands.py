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
        "reach this host's 127.0.0.1 for the webhook)",
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
