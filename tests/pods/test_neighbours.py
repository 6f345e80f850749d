"""`pod_neighbours.fits_neighbours`: what the scheduler's NodePorts and InterPodAffinity plugins
would refuse on one node, decided from the pods on it."""

from __future__ import annotations

from typing import Any

import pytest

from elasticgpu.controller.pods.pod_neighbours import HOSTNAME, fits_neighbours


def pod(name: str, *, namespace: str = "team", labels: dict[str, str] | None = None,
        anti: list[dict[str, Any]] | None = None, affinity: list[dict[str, Any]] | None = None,
        ports: list[dict[str, Any]] | None = None, phase: str | None = None,
        sidecar_ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "x", "ports": ports or []}]}
    if sidecar_ports:
        spec["initContainers"] = [{"name": "proxy", "image": "x", "restartPolicy": "Always", "ports": sidecar_ports}]
    rules: dict[str, Any] = {}
    if anti:
        rules["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": anti}
    if affinity:
        rules["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": affinity}
    if rules:
        spec["affinity"] = rules
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                                         "labels": labels or {}}, "spec": spec}
    if phase:
        body["status"] = {"phase": phase}
    return body


def term(match: dict[str, str] | None = None, *, key: str = HOSTNAME, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": match or {}}, "topologyKey": key, **extra}


WEB = {"app": "web"}


def test_a_pod_with_nothing_to_say_fits_anywhere() -> None:
    assert fits_neighbours(pod("p"), "n", [pod("a", labels=WEB), pod("b")]) == ""


def test_required_anti_affinity_on_the_node_refuses_a_matching_neighbour() -> None:
    replica = pod("web-2", labels=WEB, anti=[term(WEB)])
    why = fits_neighbours(replica, "n", [pod("web-1", labels=WEB)])
    assert "team/web-1" in why and "anti-affinity" in why and "app=web" in why
    assert fits_neighbours(replica, "n", [pod("db", labels={"app": "db"})]) == ""
    # the same labels in another namespace are not in the term's scope (its own namespace by default)
    assert fits_neighbours(replica, "n", [pod("web-1", namespace="other", labels=WEB)]) == ""
    # ... unless the term names it, or selects every namespace
    named = pod("web-2", labels=WEB, anti=[term(WEB, namespaces=["other"])])
    assert fits_neighbours(named, "n", [pod("web-1", namespace="other", labels=WEB)]) != ""
    every = pod("web-2", labels=WEB, anti=[term(WEB, namespaceSelector={})])
    assert fits_neighbours(every, "n", [pod("web-1", namespace="other", labels=WEB)]) != ""


def test_anti_affinity_of_a_pod_already_there_refuses_the_newcomer() -> None:
    loner = pod("loner", labels={"app": "loner"}, anti=[term(WEB)])
    why = fits_neighbours(pod("web-1", labels=WEB), "n", [loner])
    assert "team/loner" in why and "matches the pod" in why


def test_terms_over_a_wider_topology_are_left_to_the_scheduler() -> None:
    zonal = pod("web-2", labels=WEB, anti=[term(WEB, key="topology.kubernetes.io/zone")])
    assert fits_neighbours(zonal, "n", [pod("web-1", labels=WEB)]) == ""


def test_terminated_pods_and_the_pod_itself_do_not_count() -> None:
    replica = pod("web-2", labels=WEB, anti=[term(WEB)])
    assert fits_neighbours(replica, "n", [pod("web-1", labels=WEB, phase="Succeeded"), replica]) == ""


def test_match_label_keys_narrow_the_term_to_the_pod_s_own_values() -> None:
    rollout = {"app": "web", "pod-template-hash": "new"}
    replica = pod("web-new", labels=rollout, anti=[term(WEB, matchLabelKeys=["pod-template-hash"])])
    old = pod("web-old", labels={"app": "web", "pod-template-hash": "old"})
    assert fits_neighbours(replica, "n", [old]) == ""  # the old revision's replica is not in the way
    assert fits_neighbours(replica, "n", [pod("web-peer", labels=rollout)]) != ""


def test_required_affinity_needs_a_match_on_the_node_or_the_pod_itself() -> None:
    follower = pod("cache", labels={"app": "cache"}, affinity=[term(WEB)])
    assert fits_neighbours(follower, "n", [pod("web-1", labels=WEB)]) == ""
    assert "required affinity" in fits_neighbours(follower, "n", [pod("db", labels={"app": "db"})])
    first = pod("web-1", labels=WEB, affinity=[term(WEB)])  # the first of its group may go anywhere
    assert fits_neighbours(first, "n", []) == ""


def test_a_null_label_selector_matches_no_pod() -> None:
    replica = pod("web-2", labels=WEB, anti=[{"topologyKey": HOSTNAME}])
    assert fits_neighbours(replica, "n", [pod("web-1", labels=WEB)]) == ""


@pytest.mark.parametrize(("mine", "theirs", "clash"), [
    ({"hostPort": 8080}, {"hostPort": 8080}, True),
    ({"hostPort": 8080}, {"hostPort": 8081}, False),
    ({"hostPort": 8080, "protocol": "UDP"}, {"hostPort": 8080}, False),
    ({"hostPort": 8080, "hostIP": "10.0.0.1"}, {"hostPort": 8080, "hostIP": "10.0.0.2"}, False),
    ({"hostPort": 8080, "hostIP": "10.0.0.1"}, {"hostPort": 8080}, True),  # theirs on every address
    ({"hostPort": 8080, "hostIP": "10.0.0.1"}, {"hostPort": 8080, "hostIP": "10.0.0.1"}, True),
    ({"containerPort": 8080}, {"containerPort": 8080}, False),  # no host port: no clash
])
def test_host_ports(mine: dict[str, Any], theirs: dict[str, Any], clash: bool) -> None:
    why = fits_neighbours(pod("p", ports=[mine]), "n", [pod("q", ports=[theirs])])
    assert bool(why) is clash, why
    if clash:
        assert "team/q" in why and str(mine["hostPort"]) in why


def test_a_sidecar_s_host_port_counts() -> None:
    assert fits_neighbours(pod("p", ports=[{"hostPort": 9000}]), "n",
                           [pod("q", sidecar_ports=[{"hostPort": 9000}])]) != ""
