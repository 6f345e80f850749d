"""The box's pod network (tests/realcluster/box.py): a pod without hostNetwork gets an address of the
pod network, reaches the `kubernetes` Service through kube-proxy, is reached by another pod, and
`kubectl exec` goes through the API server to kubelet; the box itself reaches the API server by
its ClusterIP (as it will reach webhooks); the host's network namespace sees none of it, and a box
leaves nothing behind."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.kube_cluster import find_kubectl
from tests.realcluster import box as boxes
from tests.realcluster.box import Box

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(300)]

RUNNING_WITHIN_S = 120.0
EXEC_TIMEOUT_S = 60.0
BOX_NETWORKS = [ipaddress.IPv4Network(n) for n in (boxes.NODE_NETWORK, boxes.CLUSTER_CIDR, boxes.SERVICE_CIDR)]
SLEEP = ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]


@pytest.fixture
def box_namespace(box_api_client: client.ApiClient) -> Iterator[str]:
    """A namespace of the box's, deleted after the test (its pods with it)."""
    core = client.CoreV1Api(box_api_client)
    name = f"box-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _pod(name: str, image: str, command: list[str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [
            {"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}]},
    }  # fmt: skip


def run_pod(core: client.CoreV1Api, namespace: str, name: str, image: str, command: list[str] = SLEEP) -> Any:
    """Create a pod (no hostNetwork) and return it once Running (the scheduler places it on the box's node)."""
    core.create_namespaced_pod(namespace, _pod(name, image, command))
    deadline = time.monotonic() + RUNNING_WITHIN_S
    while (pod := core.read_namespaced_pod(name, namespace)).status.phase != "Running":
        assert pod.status.phase == "Pending", pod.status
        assert time.monotonic() < deadline, f"{namespace}/{name} not Running in {RUNNING_WITHIN_S:.0f} s: {pod.status}"
        time.sleep(0.5)
    return pod


def kubectl_exec(box: Box, namespace: str, pod: str, *command: str) -> subprocess.CompletedProcess[str]:
    """`kubectl exec` as a user runs it: kubectl -> the forwarder -> the API server -> kubelet -> containerd."""
    kubectl = find_kubectl()
    if kubectl is None:
        pytest.skip("kubectl not found: run `bash testserver/build.sh` (it unpacks one) or set ELASTICGPU_KUBECTL_BIN")
    return subprocess.run(
        [str(kubectl), "--kubeconfig", str(box.kubeconfig), "-n", namespace, "exec", pod, "--", *command],
        capture_output=True, text=True, timeout=EXEC_TIMEOUT_S,
    )  # fmt: skip


def test_a_pod_gets_a_pod_address_reaches_the_kubernetes_service_and_kubectl_exec_works(
    box: Box, box_api_client: client.ApiClient, box_namespace: str
) -> None:
    core = client.CoreV1Api(box_api_client)
    pod = run_pod(core, box_namespace, "a", box.runtime.image)
    assert not pod.spec.host_network
    assert pod.spec.node_name == box.node
    assert ipaddress.IPv4Address(pod.status.pod_ip) in ipaddress.IPv4Network(box.pod_subnet), pod.status.pod_ip

    # exec through the API server (API server -> kubelet on the node address): the pod's own view.
    seen = kubectl_exec(box, box_namespace, "a", "ip", "-4", "-o", "addr", "show", "eth0")
    assert seen.returncode == 0, seen.stderr
    assert f"inet {pod.status.pod_ip}/" in seen.stdout

    # The Service as the pod's environment names it, through kube-proxy's DNAT to the node address.
    env = kubectl_exec(box, box_namespace, "a", "sh", "-c", "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT")
    assert env.stdout.strip() == f"{box.service_ip}:443", env
    reached = kubectl_exec(box, box_namespace, "a", "nc", "-w", "5", box.service_ip, "443")
    assert reached.returncode == 0, reached.stderr
    # The control: a port the Service does not have is refused (nc does report failures).
    refused = kubectl_exec(box, box_namespace, "a", "nc", "-w", "5", box.service_ip, "444")
    assert refused.returncode != 0, refused


def test_two_pods_reach_each_other_by_address(box: Box, box_api_client: client.ApiClient, box_namespace: str) -> None:
    core = client.CoreV1Api(box_api_client)
    word = uuid.uuid4().hex
    serve = f"mkdir -p /www && echo {word} > /www/index.html && exec httpd -f -p 8080 -h /www"
    server = run_pod(core, box_namespace, "server", box.runtime.image, ["/bin/sh", "-c", serve])
    run_pod(core, box_namespace, "client", box.runtime.image)
    # nc speaks the HTTP (busybox-static's wget crashes in the static libc's resolver here, exit 139).
    ask = f"printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {server.status.pod_ip} 8080"
    fetched = kubectl_exec(box, box_namespace, "client", "sh", "-c", ask)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.startswith("HTTP/1.") and fetched.stdout.rstrip().endswith(word), fetched.stdout


def test_a_service_of_a_pod_is_reached_by_its_cluster_ip_from_a_pod_and_from_the_box(
    box: Box, box_api_client: client.ApiClient, box_namespace: str
) -> None:
    """The way the API server calls a webhook: from the box (where it runs) to a Service's ClusterIP,
    which kube-proxy sends to the pod behind it; and the same from another pod."""
    core = client.CoreV1Api(box_api_client)
    word = uuid.uuid4().hex
    serve = f"mkdir -p /www && echo {word} > /www/index.html && exec httpd -f -p 8080 -h /www"
    run_pod(core, box_namespace, "web", box.runtime.image, ["/bin/sh", "-c", serve])
    service = core.create_namespaced_service(box_namespace, {
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    })  # fmt: skip
    cluster_ip = service.spec.cluster_ip
    assert ipaddress.IPv4Address(cluster_ip) in ipaddress.IPv4Network(boxes.SERVICE_CIDR)

    def get() -> str:
        connection = socket.create_connection((cluster_ip, 80), timeout=5)
        with connection:
            connection.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := connection.recv(4096):
                answer += chunk
        return answer.decode(errors="replace")

    # kube-proxy programs the Service once its EndpointSlice names the pod: not at once.
    deadline = time.monotonic() + RUNNING_WITHIN_S
    while True:
        try:
            answer = box.in_box(get)
            break
        except OSError:
            assert time.monotonic() < deadline, f"the Service {cluster_ip}:80 not reached from the box"
            time.sleep(0.5)
    assert answer.startswith("HTTP/1.") and answer.rstrip().endswith(word), answer

    run_pod(core, box_namespace, "caller", box.runtime.image)
    ask = f"printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {cluster_ip} 80"
    fetched = kubectl_exec(box, box_namespace, "caller", "sh", "-c", ask)
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.rstrip().endswith(word), fetched.stdout


def test_the_box_reaches_the_api_server_by_its_cluster_ip(box: Box) -> None:
    """What the API server needs to call a webhook by its Service: a ClusterIP works from the box
    itself (kube-proxy's rules in the box's output hook), TLS and all (the certificate names it)."""
    import ssl
    import urllib.request

    context: ssl.SSLContext = box.plane.ssl_context()

    def version() -> dict[str, Any]:
        with urllib.request.urlopen(f"https://{box.service_ip}/version", timeout=10, context=context) as answer:
            return dict(json.load(answer))

    assert box.in_box(version)["gitVersion"].startswith("v1.")


def _host_view() -> tuple[list[str], list[str]]:
    """The host's IPv4 addresses (with prefix) and link names, from its own network namespace."""
    links = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True,
                                      timeout=10).stdout)  # fmt: skip
    addresses = [f"{a['local']}/{a['prefixlen']}" for link in links for a in link.get("addr_info", [])
                 if a.get("family") == "inet"]  # fmt: skip
    return addresses, [link["ifname"] for link in links]


def _running(pid: int) -> str | None:
    """What pid runs ("state ppid command"), None when it is gone or a zombie (exited, not yet reaped)."""
    try:
        state, ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return None if state == "Z" else f"{state} ppid={ppid} {command}"


def _sandbox_ids(endpoint: str) -> list[str]:
    """The ids of the pod sandboxes of a containerd, through CRI."""
    import grpc

    from elasticgpu.agent.cri import api

    with grpc.insecure_channel(endpoint) as channel:
        stub = api.services.RuntimeServiceStub(channel)
        return [s.id for s in stub.ListPodSandbox(api.pb.ListPodSandboxRequest(), timeout=10).items]


def _in_box_networks(address: str) -> bool:
    return any(ipaddress.IPv4Interface(address).ip in n for n in BOX_NETWORKS)


def test_the_host_sees_none_of_the_box(box: Box) -> None:
    addresses, links = _host_view()
    assert not [a for a in addresses if _in_box_networks(a)], addresses
    assert not [n for n in links if n.startswith(("egbox", "egcni", "veth"))], links
    # ...while the box has them (the check looks where they are).
    inside = box.netns.ip("-4", "-o", "addr", "show")
    assert f"inet {boxes.NODE_ADDRESS}/" in inside, inside


def test_a_box_leaves_nothing_behind() -> None:
    """A box of its own with a pod (so a pod sandbox, its network namespace and veth), removed: no
    namespace, link, address, process, folder or cgroup of it is left, and the host's addresses are
    as before."""
    before_addresses, before_links = _host_view()
    before_netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    try:
        context = boxes.running_box()
        running = context.__enter__()
    except boxes.BoxUnavailable as e:
        pytest.skip(str(e))
    try:
        api = config.new_client_from_config(config_file=str(running.kubeconfig))
        try:
            pod = run_pod(client.CoreV1Api(api), "default", "leftover", running.runtime.image)
        finally:
            api.close()
        sandboxes = _sandbox_ids(running.runtime.endpoint)
        results = [f for f in boxes.CNI_CACHE.glob("results/*") if any(i in f.name for i in sandboxes)]
        assert results, f"no CNI result cached for the pod's sandbox {sandboxes}?"
        pids = running.netns.pids()
        assert pids, "no process in the box's namespace?"
        during_netns = set(os.listdir("/run/netns"))
        assert running.netns.name in during_netns
        folders = [running.directory, running.plane.directory, running.runtime.directory, running.kubelet.directory]
        cgroup_root = running.kubelet.config["cgroupRoot"]
    finally:
        context.__exit__(None, None, None)

    after_netns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    assert running.netns.name not in after_netns
    # The pod's own namespace (containerd's cni-<uuid>) is gone too.
    assert not [n for n in after_netns - before_netns if n.startswith(("cni-", boxes.NETNS_PREFIX))], after_netns
    assert not running.netns.killed, f"killed at the end, not stopped by their part: {running.netns.killed}"
    alive = {p: what for p in pids if (what := _running(p))}
    assert not alive, f"processes of the box still running: {alive}"
    assert not [f for f in folders if f.exists()]
    assert not [f for f in results if f.exists()], "CNI results of the box's sandbox left in /var/lib/cni"
    assert not list(Path("/var/log/pods").glob(f"*_{pod.metadata.uid}")), "the pod's logs left in /var/log/pods"
    assert not list(Path("/sys/fs/cgroup").glob(f"*/{cgroup_root.strip('/')}"))
    after_addresses, after_links = _host_view()
    assert sorted(after_addresses) == sorted(before_addresses)
    assert not set(after_links) - set(before_links)
