"""Isolation modes in real containers (issue 25): kubelet (our CRI client) -> proxy with claim hooks ->
real containerd. What each mode puts into the container is read back from inside it (ExecSync); the MPS
daemon's life is followed with a stand-in control binary at the driver-root path."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from elasticgpu.agent import isolation
from elasticgpu.agent.cri.proxy import CriProxy, ProxySettings
from elasticgpu.agent.injecting import claim_hooks
from elasticgpu.agent.ledger import store
from tests.agent.cri.isolation_node import SHM_FILE, IsolationNode, mounts_under, wait_until
from tests.agent.cri.kubelet import Kubelet
from tests.agent.cri.node import CARDS, View, publish_cards, slice_claim, whole_claim
from tests.containerd_runtime import TestRuntime

NS = "team"
CARD = CARDS[0].uuid


@dataclass
class Node:
    view: View
    kubelet: Kubelet
    hooks: claim_hooks.ClaimHooks
    isolation: IsolationNode


def make_node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path, **stand_ins: bool) -> Iterator[Node]:
    publish_cards(containerd.cdi_dir, containerd.directory / "dev")
    view = View()
    ledger = store.LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    node = IsolationNode(tmp_path, **stand_ins)
    hooks = claim_hooks.ClaimHooks(view=view, ledger=ledger, rooms=node.rooms)
    settings = ProxySettings(listen=proxy_socket, upstream=str(containerd.socket))
    try:
        with CriProxy(settings, container_hooks=hooks) as proxy, Kubelet(f"unix://{proxy_socket}",
                                                                         containerd.image) as k:
            assert proxy.reconciled.wait(10)
            yield Node(view=view, kubelet=k, hooks=hooks, isolation=node)
    finally:
        hooks.close()
        ledger.close()
        node.close()


@pytest.fixture
def node(containerd: TestRuntime, proxy_socket: Path, tmp_path: Path) -> Iterator[Node]:
    yield from make_node(containerd, proxy_socket, tmp_path)


def uses(claim: str, container: str = "main") -> dict[str, str]:
    return {f"egpuc.elasticgpu.io/{container}": claim}


def run(node: Node, pod_name: str, claim: str, *, mode: str, container: str = "main", **changes: object) -> str:
    """A pod `pod_name` whose container uses a Bound slice claim `claim` of isolation `mode`; its id."""
    node.view.add(slice_claim(NS, claim, user=pod_name, isolation=mode, **changes))
    pod = node.kubelet.run_pod(pod_name, NS, annotations=uses(claim, container))
    container_id = node.kubelet.create_container(pod, container)
    node.kubelet.start(container_id)
    return container_id


def sh(node: Node, container_id: str, script: str) -> tuple[int, str]:
    return node.kubelet.exec(container_id, "sh", "-c", script)


def test_hami_core_preloads_the_library_with_the_slice_and_a_cache_of_its_own(node: Node) -> None:
    first = run(node, "trainer", "train", mode="HAMiCore")
    env = node.kubelet.env(first)
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (
        "10240m", "30", "30")
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == "/tmp/vgpu/vgpu.cache"
    assert not any(key.startswith("CUDA_MPS") for key in env)  # MPS's names belong to mode MPS
    assert sh(node, first, "cat /etc/ld.so.preload") == (0, "/usr/local/vgpu/libvgpu.so\n")
    assert sh(node, first, "cat /usr/local/vgpu/libvgpu.so") == (0, "stand-in for HAMi-core's libvgpu.so\n")
    # Both read-only: a process of the container cannot unload the limiter or change it.
    assert sh(node, first, "echo > /etc/ld.so.preload")[0] != 0
    assert sh(node, first, "echo > /usr/local/vgpu/libvgpu.so")[0] != 0
    # The shared cache is the container's own: another container's limits never leak into it.
    assert sh(node, first, "echo first > /tmp/vgpu/vgpu.cache")[0] == 0
    second = run(node, "other", "other", mode="HAMiCore", memory_mib=2048)
    assert node.kubelet.env(second)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert sh(node, second, "cat /tmp/vgpu/vgpu.cache")[0] != 0
    caches = node.isolation.state / "hami-core/cache"
    assert len(list(caches.iterdir())) == 2
    # A removed container's cache goes with it.
    node.kubelet.remove_container(second)
    node.hooks.flush()
    wait_until("the second cache removed", lambda: len(list(caches.iterdir())) == 1)
    assert sh(node, first, "cat /tmp/vgpu/vgpu.cache") == (0, "first\n")


def test_mode_none_is_advisory_and_mounts_nothing(node: Node) -> None:
    container_id = run(node, "trainer", "train", mode="None")
    env = node.kubelet.env(container_id)
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_DEVICE_MEMORY_LIMIT_0"]) == ("30", "10240m")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env and "CUDA_DEVICE_MEMORY_SHARED_CACHE" not in env
    assert sh(node, container_id, "test -e /etc/ld.so.preload || test -e /run/nvidia-mps")[0] != 0
    assert node.isolation.starts() == []


def test_whole_cards_get_no_mode_whatever_the_claim_says(node: Node) -> None:
    node.view.add(whole_claim(NS, "card", user="renderer"))
    pod = node.kubelet.run_pod("renderer", NS, annotations=uses("card"))
    container_id = node.kubelet.create_container(pod, "main")
    node.kubelet.start(container_id)
    env = node.kubelet.env(container_id)
    assert not any(key.startswith(("CUDA_MPS", "CUDA_DEVICE")) for key in env)


def test_mps_gives_the_card_s_pipe_folder_and_the_claim_s_own_limits(node: Node) -> None:
    container_id = run(node, "trainer", "train", mode="MPS")
    env = node.kubelet.env(container_id)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    assert not any(key.startswith("CUDA_DEVICE_") for key in env)  # HAMi-core's names belong to HAMiCore
    # The pipe folder is the card's daemon's: the container sees the pid file the daemon wrote there.
    code, out = sh(node, container_id, "cat /run/nvidia-mps/nvidia-cuda-mps-control.pid")
    assert code == 0 and int(out) == node.isolation.daemons.pid(CARD)
    assert sh(node, container_id, "test -e /etc/ld.so.preload")[0] != 0


def test_mps_clients_of_a_card_share_its_daemon_s_dev_shm_and_nobody_else_does(node: Node) -> None:
    """The MPS server and its clients share POSIX shared memory: the daemon runs with the card's tmpfs as its
    /dev/shm, and every MPS container of the card gets the same tmpfs at /dev/shm (not its own)."""
    iso = node.isolation
    first = run(node, "a", "a", mode="MPS")
    shm = iso.daemons.folder(CARD) / "shm"  # the card's folder under the agent's isolation state
    # What the daemon wrote into its /dev/shm is in the card's folder on the node (a tmpfs of the set size),
    # not in the node's /dev/shm.
    wait_until("the stand-in server wrote into its /dev/shm", lambda: (shm / SHM_FILE).exists())
    assert (shm / SHM_FILE).read_text() == f"{CARD}\n"
    assert mounts_under(shm) == [str(shm)]
    stat = os.statvfs(shm)
    assert stat.f_blocks * stat.f_frsize == 8 * 2**20
    # A client container of the card sees it, and what the client writes there, the daemon's side sees.
    assert sh(node, first, f"cat /dev/shm/{SHM_FILE}") == (0, f"{CARD}\n")
    assert sh(node, first, "echo client > /dev/shm/from-client")[0] == 0
    assert (shm / "from-client").read_text() == "client\n"
    second = run(node, "b", "b", mode="MPS", memory_mib=2048)  # another claim of the card: the same memory
    assert sh(node, second, "cat /dev/shm/from-client") == (0, "client\n")

    # An MPS container of another card has that card's own; a container of mode None keeps its own.
    other_card = CARDS[1].uuid
    other = run(node, "c", "c", mode="MPS", gpus=(other_card,))
    assert sh(node, other, f"cat /dev/shm/{SHM_FILE}") == (0, f"{other_card}\n")
    assert sh(node, other, "test -e /dev/shm/from-client")[0] != 0
    plain = run(node, "d", "d", mode="None")
    assert sh(node, plain, f"test -e /dev/shm/{SHM_FILE} || test -e /dev/shm/from-client")[0] != 0
    assert sh(node, plain, "echo plain > /dev/shm/plain")[0] == 0
    assert not (shm / "plain").exists() and not iso.daemons.shm_dir(other_card).joinpath("plain").exists()

    # The daemon killed: started again on the same tmpfs (the card's containers hold it).
    [pid, _] = [iso.daemons.pid(CARD), iso.daemons.pid(other_card)]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until("the daemon started again", lambda: iso.daemons.pid(CARD) not in (None, pid))
    assert mounts_under(shm) == [str(shm)] and (shm / "from-client").exists()

    # No MPS container of the card left: the daemon stops for good and its /dev/shm goes.
    for container_id in (first, second):
        node.kubelet.remove_container(container_id)
    node.hooks.flush()
    wait_until("the card's /dev/shm removed", lambda: not shm.exists())
    assert mounts_under(shm) == [] and iso.daemons.pid(CARD) is None
    assert mounts_under(iso.daemons.shm_dir(other_card)) == [str(iso.daemons.shm_dir(other_card))]


def test_mps_daemon_once_per_card_restarted_after_kill_9_and_stopped_when_unused(node: Node) -> None:
    iso = node.isolation
    first = run(node, "a", "a", mode="MPS")
    run(node, "b", "b", mode="MPS", memory_mib=2048)  # another claim on the same card: the same daemon
    assert iso.starts() == [CARD]
    [pid] = iso.servers()
    assert iso.daemons.pid(CARD) == pid
    started = iso.record.read_text().splitlines()[0].split()
    assert started[2:] == [str(iso.daemons.pipe_dir(CARD)), str(iso.daemons.log_dir(CARD))]

    # kill -9: the supervisor starts it again (once), with the same card and folders.
    os.kill(pid, signal.SIGKILL)
    wait_until("the daemon started again", lambda: iso.starts() == [CARD, CARD] and len(iso.servers()) == 1)
    [again] = iso.servers()
    assert again != pid and iso.daemons.pid(CARD) == again
    assert node.kubelet.env(first)["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"

    # One claim's containers gone: the other still uses the card, the daemon stays.
    for container_id in list(node.kubelet.container_ids()):
        if container_id == first:
            node.kubelet.remove_container(container_id)
    node.hooks.flush()
    assert iso.servers() == [again] and iso.quits() == []
    # The last one gone: `quit`, and no server is left.
    for container_id in list(node.kubelet.container_ids()):
        node.kubelet.remove_container(container_id)
    node.hooks.flush()
    wait_until("the daemon stopped", lambda: iso.servers() == [])
    assert iso.quits() == [CARD]
    assert iso.starts() == [CARD, CARD]  # and not started again: nothing wants it


def test_never_two_daemons_for_one_card(tmp_path: Path) -> None:
    """Many threads and a second supervisor (an agent started twice by mistake) ensure one card at once."""
    first = IsolationNode(tmp_path / "one")
    # The second agent shares the first one's state folder (the same node).
    second = isolation.MpsDaemons(control=lambda: str(first.control), state_dir=first.state / "mps")
    failed: list[BaseException] = []

    def ensure(daemons: isolation.MpsDaemons) -> None:
        try:
            daemons.ensure(CARD)
        except BaseException as e:  # said by the test: a thread's exception alone fails nothing
            failed.append(e)

    try:  # from here on, whatever fails, the servers started are ended (first.close)
        threads = [threading.Thread(target=ensure, args=(first.daemons if i % 2 else second,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert failed == [] and not any(thread.is_alive() for thread in threads)
        # At once: ensure returns once the daemon wrote its pid file (the stand-in, after its exec of `serve`).
        # Before, it returned on the launcher's child not yet exec'd: 0 servers here, once under load.
        assert len(first.servers()) == 1
        assert first.starts() == [CARD]
        assert mounts_under(first.daemons.shm_dir(CARD)) == [str(first.daemons.shm_dir(CARD))]  # one tmpfs
    finally:
        second.close()
        first.close()


def test_a_mode_the_node_cannot_provide_refuses_the_container_with_the_fix(
    containerd: TestRuntime, proxy_socket: Path, tmp_path: Path
) -> None:
    for node in make_node(containerd, proxy_socket, tmp_path, with_mps=False, with_library=False):
        for mode, says in (("HAMiCore", "--hami-core-library"), ("MPS", "nvidia-cuda-mps-control")):
            node.view.add(slice_claim(NS, mode.lower(), user=f"pod-{mode.lower()}", isolation=mode))
            pod = node.kubelet.run_pod(f"pod-{mode.lower()}", NS, annotations=uses(mode.lower()))
            with pytest.raises(grpc.RpcError) as refused:
                node.kubelet.create_container(pod, "main")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert says in str(refused.value.details()) and f"isolated by {mode}" in str(refused.value.details())
        assert node.isolation.rooms.offered() == []


def test_a_restarted_agent_adopts_its_daemons_and_stops_them_once_unused(tmp_path: Path) -> None:
    before = IsolationNode(tmp_path / "node")
    after = isolation.MpsDaemons(control=lambda: str(before.control), state_dir=before.state / "mps",
                                 settings=isolation.DaemonSettings(check_interval_s=0.1, backoff_initial_s=0.1,
                                                                   idle_grace_s=30.0))
    gone = "GPU-00000000-dead-0000-0000-000000000000"  # a card whose daemon died while no agent ran
    try:
        before.daemons.ensure(CARD)
        before.daemons.ensure(CARDS[1].uuid)
        before.daemons.ensure(gone)
        before.daemons.close()  # the agent stops (kill -9: nothing cleaned); its daemons keep serving
        [first, second, dead] = [before.daemons.pid(u) for u in (CARD, CARDS[1].uuid, gone)]
        assert first and second and dead and len(before.servers()) == 3
        os.kill(dead, signal.SIGKILL)
        wait_until("the third daemon gone", lambda: before.daemons.pid(gone) is None)
        shm = {uuid: after.shm_dir(uuid) for uuid in (CARD, CARDS[1].uuid, gone)}
        assert all(mounts_under(folder) == [str(folder)] for folder in shm.values())

        # The runtime still has a container on the first card only: the second card's daemon goes at once
        # (it was not prepared by this agent: no grace), the first is kept, supervised and not restarted.
        # The stale /dev/shm of the card without a daemon nor a container goes too; the first card's stays.
        assert after.release_except([CARD.lower()]) == [CARDS[1].uuid.lower()]
        assert before.servers() == [first] and before.quits() == [CARDS[1].uuid]
        assert not shm[CARDS[1].uuid].exists() and not shm[gone].exists()
        assert mounts_under(after.shm_dir(CARDS[1].uuid)) == mounts_under(shm[gone]) == []
        assert mounts_under(shm[CARD]) == [str(shm[CARD])] and (shm[CARD] / SHM_FILE).exists()
        os.kill(first, signal.SIGKILL)
        # (The stand-in's `-d` is found by its environment a moment before it records its start: wait for both.)
        wait_until("the adopted daemon started again",
                   lambda: before.starts().count(CARD) == 2 and after.pid(CARD) not in (None, first))
        assert before.starts() == [CARD, CARDS[1].uuid, gone, CARD]  # restarted with the card as the driver spells it
        # The last container gone: stopped (a restart is no new use: the grace counts from the adoption).
        assert after.release_except([]) == [CARD.lower()]
        assert before.servers() == [] and before.quits() == [CARDS[1].uuid, CARD]
        assert mounts_under(before.state) == []
    finally:
        after.close()
        before.close()


def test_a_container_that_removes_the_pid_file_does_not_get_a_second_daemon(node: Node) -> None:
    """The pipe folder is writable in the container (MPS clients write to its pipes): a container may
    remove the daemon's pid file. The agent finds the daemon by its environment then, and starts none."""
    iso = node.isolation
    container_id = run(node, "trainer", "train", mode="MPS")
    [server] = iso.servers()
    assert sh(node, container_id, "rm /run/nvidia-mps/nvidia-cuda-mps-control.pid")[0] == 0
    assert not (iso.daemons.pipe_dir(CARD) / "nvidia-cuda-mps-control.pid").exists()
    assert iso.daemons.pid(CARD) == server
    iso.daemons.check()  # a supervisor pass, as its thread makes every 0.1 s here
    iso.daemons.ensure(CARD)  # and the next container of an MPS claim on the card
    assert iso.servers() == [server] and iso.starts() == [CARD]


def test_a_cache_folder_is_always_one_folder_under_the_state(tmp_path: Path) -> None:
    room = isolation.HamiCoreRoom(library="/nowhere/libvgpu.so", host_root="/", state_dir=tmp_path)
    odd = isolation.Slice(claim="ns/c", uuids=(CARD,), cores=30, memory_mib=1024, pod_uid="../../etc",
                          container="../x/y")
    folder = room.cache_dir(odd)
    assert folder.parent == tmp_path / "cache" and "/" not in folder.name and not folder.name.startswith(".")


def test_the_benchmark_runs_and_reports_each_mode_against_none(
    capsys: pytest.CaptureFixture[str], containerd: TestRuntime
) -> None:
    """bench/isolation_create.py, a few creates (on a containerd of its own; `containerd` here only skips
    the test where no runtime can run): every mode reported, and what it adds to None."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("isolation_bench", Path(__file__).resolve().parents[3] / "bench"
                                                  / "isolation_create.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lines = bench.report({"None": [10.0, 12.0, 20.0], "MPS": [10.5, 12.5, 21.0], "HAMiCore": [11.0, 13.0, 28.0]})
    assert [line.split()[0] for line in lines[1:4]] == ["None", "MPS", "HAMiCore"]
    assert lines[3].split()[-2:] == ["+1.00", "+8.00"]
    assert lines[-1] == "worst mode adds +8.00 ms at p99 over None: OVER the 5 ms target"
    assert bench.main(["--creates", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "MPS daemons started: 1" in out and "HAMiCore" in out


def test_a_daemon_without_its_dev_shm_is_refused_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fallback to an unbounded folder: a size of 0 (tmpfs: no limit) is refused naming the setting, and a
    node without util-linux's unshare does not offer MPS, saying what is missing."""
    node = IsolationNode(tmp_path / "node", shm_size_mib=0)
    try:
        room = node.rooms.room("MPS")
        with pytest.raises(isolation.Unavailable) as refused:
            room.prepare(isolation.Slice(claim="ns/c", uuids=(CARD,), cores=30, memory_mib=1024, pod_uid="u",
                                         container="main"))
        assert "--mps-shm-size-mib" in refused.value.message and not refused.value.retryable
        assert node.servers() == []
        assert mounts_under(node.state) == []
        only_sh = tmp_path / "bin"
        only_sh.mkdir()
        (only_sh / "sh").symlink_to("/bin/sh")
        monkeypatch.setenv("PATH", str(only_sh))
        assert "unshare" in (room.problem() or "") and "MPS" not in node.rooms.offered()
    finally:
        node.close()


def test_a_daemon_from_before_the_shared_dev_shm_is_replaced_once_unused(tmp_path: Path) -> None:
    """An agent upgrade finds a daemon that uses the node's /dev/shm: clients in containers would not reach it.
    New MPS containers of the card are refused (retryable) until no container uses it; then it is stopped
    and the next container gets a daemon with the card's /dev/shm."""
    node = IsolationNode(tmp_path / "node")
    slice_ = isolation.Slice(claim="ns/c", uuids=(CARD,), cores=30, memory_mib=1024, pod_uid="u", container="main")
    try:
        room = node.rooms.room("MPS")
        room.prepare(slice_)
        [old] = node.servers()
        shm = node.daemons.shm_dir(CARD)
        subprocess.run(["umount", str(shm)], check=True)  # as a daemon of the earlier agent: no tmpfs
        with pytest.raises(isolation.Unavailable) as refused:
            room.prepare(slice_)
        assert refused.value.retryable and "replaced once no MPS container uses the card" in refused.value.message
        assert node.servers() == [old]
        assert node.daemons.release_except([]) == [CARD.lower()]  # no container of the card any more
        assert node.servers() == []
        room.prepare(slice_)
        assert node.servers() != [old] and len(node.servers()) == 1 and mounts_under(shm) == [str(shm)]
    finally:
        node.close()


def test_mps_puts_the_claim_s_limits_on_the_card_s_daemon_not_only_in_the_client_s_env(node: Node) -> None:
    """Issue 33.7: a client's CUDA_MPS_* environment is its own (a child can start with other values); MPS obeys
    the lower of it and the control daemon's limits, so the agent gives the daemon the card's ceiling."""
    iso = node.isolation
    run(node, "trainer", "train", mode="MPS")  # 30% and 10 GiB
    assert iso.commands(CARD) == ["get_server_list", "set_default_active_thread_percentage 30",
                                  "set_default_device_pinned_mem_limit 0 10240M"]


def test_the_ceiling_covers_every_mps_claim_of_the_card_and_outlives_a_restart(tmp_path: Path) -> None:
    """A second, larger claim on the card widens the ceiling, for running servers too (get_server_list); a memory-
    only slice lifts the compute ceiling; a daemon started again (killed, or a tenant's `quit`) gets it again."""
    iso = IsolationNode(tmp_path)
    ceiling = isolation.mps_ceiling.Ceiling
    try:
        iso.daemons.ensure(CARD, ceiling.of(30, 10240))
        iso.daemons.ensure(CARD, ceiling.of(20, 4096))  # within the ceiling: nothing to send
        assert iso.commands(CARD) == ["get_server_list", "set_default_active_thread_percentage 30",
                                      "set_default_device_pinned_mem_limit 0 10240M"]
        (iso.daemons.pipe_dir(CARD) / "servers").write_text("4242\n")  # a client spawned a server meanwhile
        iso.daemons.ensure(CARD, ceiling.of(50, 2048))
        assert iso.commands(CARD)[3:] == [
            "get_server_list", "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit 0 10240M", "set_active_thread_percentage 4242 50",
            "set_device_pinned_mem_limit 4242 0 10240M"]
        assert iso.daemons.ceiling(CARD) == ceiling(50, 10240)

        iso.daemons.ensure(CARD, ceiling.of(0, 8192))  # memory only: no compute reserved, no compute ceiling
        assert iso.daemons.ceiling(CARD) == ceiling(100, 10240)
        assert iso.commands(CARD)[-1] == "set_device_pinned_mem_limit 4242 0 10240M"
        assert not any(c.startswith("set_active_thread_percentage") for c in iso.commands(CARD)[-3:])

        # The daemon killed: started again by the supervisor, and given the ceiling again.
        sent = len(iso.commands(CARD))
        (iso.daemons.pipe_dir(CARD) / "servers").unlink()
        [pid] = iso.servers()
        os.kill(pid, signal.SIGKILL)
        wait_until("the daemon started again with its ceiling", lambda: len(iso.commands(CARD)) > sent + 1)
        assert iso.commands(CARD)[sent:] == ["get_server_list", "set_default_device_pinned_mem_limit 0 10240M"]
    finally:
        iso.close()


def test_a_daemon_that_refuses_its_ceiling_refuses_the_container_retryably(node: Node) -> None:
    """No container of an MPS claim starts with limits only its own environment sets."""
    iso = node.isolation
    iso.control.write_text(iso.control.read_text().replace('while read -r command; do',
                                                           'echo "no" >&2; exit 3\n    while read -r command; do'))
    node.view.add(slice_claim(NS, "train", user="trainer", isolation="MPS"))
    pod = node.kubelet.run_pod("trainer", NS, annotations=uses("train"))
    with pytest.raises(grpc.RpcError) as refused:
        node.kubelet.create_container(pod, "main")
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "get_server_list" in str(refused.value.details()) and "kubelet retries" in str(refused.value.details())


def test_mps_containers_of_one_card_running_as_different_uids_are_warned_about(node: Node) -> None:
    """MPS runs one server per uid on a card: clients of another uid wait until the running server's clients are
    done. The agent says so with a Warning Event on the pod (the container starts: a refusal would let whoever came
    first lock the card for its uid); pods of one uid, or whose uid the agent cannot know, are not warned about."""
    def start(pod_name: str, claim: str, user: int | None) -> str:
        node.view.add(slice_claim(NS, claim, user=pod_name, isolation="MPS", cores=10, memory_mib=2048))
        pod = node.kubelet.run_pod(pod_name, NS, annotations=uses(claim))
        container_id = node.kubelet.create_container(pod, "main", run_as_user=user)
        node.kubelet.start(container_id)
        return container_id

    start("a", "a", 1000)
    start("b", "b", 1000)
    start("c", "c", None)  # the image's user: unknown here
    assert node.view.warnings == []
    start("d", "d", 2000)
    [(pod, reason, message)] = node.view.warnings
    assert (pod.name, reason) == ("d", claim_hooks.ISOLATION_WARNING_REASON)
    assert "runs as uid 2000" in message and "run as uid 1000" in message and "runAsUser" in message
    # A container cannot forge the annotation the agent reads the uids back from.
    node.view.add(slice_claim(NS, "e", user="e", isolation="MPS", cores=10, memory_mib=2048))
    pod = node.kubelet.run_pod("e", NS, annotations=uses("e"))
    forged = node.kubelet.create_container(pod, "main", annotations={isolation.ANNOTATION_MPS_USER: "1000"},
                                           run_as_user=3000)
    status = node.kubelet.runtime.ContainerStatus(
        node.kubelet.pb.ContainerStatusRequest(container_id=forged), timeout=10)
    assert status.status.annotations[isolation.ANNOTATION_MPS_USER] == "3000"
