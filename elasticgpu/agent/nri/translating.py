"""NRI's messages (as the plugin relays them, protojson) to and from the injection core's plain values.

    container_request   PodSandbox + Container of a CreateContainer -> injection.ContainerRequest
    adjustment          injection.ContainerEdit -> a ContainerAdjustment (protojson), as a diff of
                        the container the runtime is creating: env and annotations added, replaced
                        or removed (NRI's "-key" marks removal), the edit's mounts, and our CDI
                        devices resolved into device nodes with their device-cgroup rules, their
                        mounts, env and hooks (the NRI of containerd 1.7 and 2.0 takes no CDI names);
                        raises NotAdjustable for an edit NRI cannot carry out (below)
    runtime_container   a Container of Synchronize or an event -> hooks.RuntimeContainer
    sees_a_card         whether a running container can reach a card through the NVIDIA hook (its
                        NVIDIA_VISIBLE_DEVICES) or through our device nodes (Synchronize's sweep)

What NRI cannot do (issue 44), so that the front refuses the creation rather than let it run
otherwise than the core decided, where the CRI proxy rewrites the request itself:
  - remove: the runtime applies a plugin's additions and replacements only; the NRI of containerd
    1.7 to 2.x drops its removals of env and devices (containerd/nri#80, #216), so our CDI devices
    the runtime already gave a container (the CRI CDI field, a cdi.k8s.io/ annotation) stay, with
    their device-cgroup rules, and so does env the core clears for a claim's container;
  - set a key named twice: containerd keeps the image's ENV and the pod's env of one key as two
    entries, and NRI's env adjustment replaces the first and lets the later ones write their value
    back (one entry is left, the last one's), so `NVIDIA_VISIBLE_DEVICES` named twice keeps the
    tenant's value (`all`: every card, through the NVIDIA hook).

Nothing here decides: serving.py calls these around the core's hooks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting import cdi, hooks, injection

VISIBLE_NO_CARD = (injection.VISIBLE_NONE, "none", "")
"""NVIDIA_VISIBLE_DEVICES values under which the NVIDIA hook gives a container no card (`none`: the
driver's files but no device; empty or `void`: nothing)."""


class NotAdjustable(ValueError):
    """An edit NRI cannot carry out on this container (see the module docstring); `message` says what to change."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# NRI's ContainerState: CONTAINER_STOPPED is 4 (UNKNOWN 0, CREATED 1, PAUSED 2, RUNNING 3).
_STOPPED = ("CONTAINER_STOPPED", 4)
# CDI hook names -> NRI Hooks fields (protojson names).
_HOOKS = {"prestart": "prestart", "createRuntime": "createRuntime", "createContainer": "createContainer",
          "startContainer": "startContainer", "poststart": "poststart", "poststop": "poststop"}


def _env(container: Mapping[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    for item in container.get("env") or []:
        key, _, value = str(item).partition("=")
        pairs.append((key, value))
    return pairs


def privileged(container: Mapping[str, Any]) -> bool:
    """Whether the runtime made the container privileged: NRI (v0.6) does not say so itself, but a
    privileged container's device cgroup allows every device (a rule with no type or type `a`, and no
    numbers) where any other's starts by denying all."""
    rules = ((container.get("linux") or {}).get("resources") or {}).get("devices") or []
    return any(rule.get("allow") and rule.get("type", "a") in ("", "a") and "major" not in rule and "minor" not in rule
               for rule in rules)


def our_devices(container: Mapping[str, Any], card_nodes: Mapping[tuple[str, int, int], str]) -> list[str]:
    """Our CDI devices that the runtime gave a container that is not privileged (its device nodes that are our
    cards', `cdi.card_nodes`), in name order; a privileged container has every node of the host: none counts."""
    if privileged(container):
        return []
    found = set()
    for node in (container.get("linux") or {}).get("devices") or []:
        try:
            # protojson leaves out a zero (minor 0: the first card), and writes int64 as a string
            key = (str(node.get("type", "")), int(node.get("major", 0)), int(node.get("minor", 0)))
        except (TypeError, ValueError):
            continue
        if (name := card_nodes.get(key)) is not None:
            found.add(name)
    return sorted(found)


def container_request(pod: Mapping[str, Any], container: Mapping[str, Any], *,
                      card_nodes: Mapping[tuple[str, int, int], str] | None = None) -> injection.ContainerRequest:
    """The plain view of an NRI CreateContainer that the core reads (the pod from the sandbox; kubelet's
    io.kubernetes.pod.* labels when the sandbox lacks a field). The runtime has resolved the container's CDI
    devices before NRI is asked: ours come back as CDI names from their device nodes (`card_nodes`), so that
    the core decides on them as on the CRI field's."""
    labels = dict(pod.get("labels") or {})
    ref = injection.PodRef(
        pod.get("namespace") or labels.get(injection.LABEL_POD_NAMESPACE, ""),
        pod.get("name") or labels.get(injection.LABEL_POD_NAME, ""),
        pod.get("uid") or labels.get(injection.LABEL_POD_UID, ""),
    )
    return injection.ContainerRequest(
        pod=ref,
        pod_annotations=dict(pod.get("annotations") or {}),
        container=container.get("name") or (container.get("labels") or {}).get(injection.LABEL_CONTAINER_NAME, ""),
        envs=_env(container),
        cdi_devices=our_devices(container, card_nodes or {}),
        annotations=dict(container.get("annotations") or {}),
        privileged=privileged(container),
        run_as_user=None,  # not in NRI's Container (v0.6); MPS then serves the image's user
        pod_labels=labels,
        container_id=container.get("id") or None,  # NRI names it before the runtime creates the container
    )


def _check_devices(request: injection.ContainerRequest, edit: injection.ContainerEdit) -> None:
    kept = set(edit.devices) | {d for d in edit.cdi_devices if injection.is_ours(d)}
    if extra := [d for d in request.cdi_devices if d not in kept]:
        whose = (f"that its ElasticGPUClaim {edit.claim.namespace}/{edit.claim.name} does not hold"
                 if edit.claim is not None else "without an ElasticGPUClaim")
        raise NotAdjustable(
            f"it asks for the elasticgpu agent's CDI device(s) {', '.join(extra)} {whose} (the CRI CDI field, or a "
            "cdi.k8s.io/ annotation, as another device plugin could hand out); the runtime added them before the "
            "agent's NRI plugin was asked, and NRI does not let a plugin take a device out: drop those CDI devices "
            "from the container (a claim gives it its cards)")


def _check_env(request: injection.ContainerRequest, edit: injection.ContainerEdit,
               wanted: Mapping[str, str]) -> None:
    entries: dict[str, list[str]] = {}
    for key, value in request.envs:
        entries.setdefault(key, []).append(value)
    for key, value in wanted.items():
        values = entries.get(key, [])
        if len(values) < 2 or values[-1] == value:
            continue  # NRI replaces a single entry (or adds one); the last of several already says ours
        no_card = values[-1].strip().lower() in VISIBLE_NO_CARD
        if key == injection.ENV_VISIBLE_DEVICES and edit.claim is None and no_card:
            continue  # no card either way (the pod asked for `none` itself): left as the runtime keeps it
        raise NotAdjustable(
            f"its environment names {key} {len(values)} times (the image's ENV and the pod's env both set it); the "
            f"runtime keeps the last ({values[-1]!r}), and NRI lets the elasticgpu agent replace only one, so it "
            f"cannot set {key}={value}: remove {key} from the container's env in the pod spec (the agent sets it)")
    if edit.claim is not None and (cleared := sorted(k for k in entries if k not in wanted)):
        raise NotAdjustable(
            f"its environment sets {', '.join(cleared)} (from the image's ENV or the pod's env), which the elasticgpu "
            f"agent controls for the container of ElasticGPUClaim {edit.claim.namespace}/{edit.claim.name} and must "
            "clear here, and NRI does not let a plugin remove a variable: remove it from the pod's env, or use an "
            "image that does not set it")


def adjustment(container: Mapping[str, Any], edit: injection.ContainerEdit | None, cdi_dir: Path, *,
               request: injection.ContainerRequest | None = None) -> dict[str, Any]:
    """The ContainerAdjustment (protojson) that turns the container the runtime is creating into the edit's;
    raises cdi.UnresolvedDevice when one of our CDI devices cannot be resolved, and NotAdjustable when NRI
    cannot carry the edit out on `request` (the container as the core saw it), so the creation is refused."""
    if edit is None:
        return {}
    adjust: dict[str, Any] = {}
    before = dict(_env(container))
    after = dict(edit.envs)
    env = [{"key": f"-{key}"} for key in before if key not in after]
    resolved = cdi.resolve(cdi_dir, edit.devices)
    # Each key once: the runtime refuses an adjustment that sets one twice ("both tried to set env"), as a
    # MIG edit does (its CDI spec and its env both name the instance). The edit's value is the later one,
    # as the runtime's own CDI injection would leave it.
    wanted = dict(resolved.env)
    wanted.update(edit.envs)
    if request is not None:
        _check_devices(request, edit)
        _check_env(request, edit, wanted)
    for key, value in wanted.items():
        if before.get(key) != value or key in dict(resolved.env):
            env.append({"key": key, "value": value})
    if env:
        adjust["env"] = env
    annotations_before = dict(container.get("annotations") or {})
    annotations = {f"-{key}": "" for key in annotations_before if key not in edit.annotations}
    annotations.update({k: v for k, v in edit.annotations.items() if annotations_before.get(k) != v})
    if annotations:
        adjust["annotations"] = annotations
    mounts = [{"destination": m["containerPath"], "source": m["hostPath"], "type": m.get("type") or "bind",
               "options": list(m.get("options") or ["ro", "nosuid", "nodev", "bind"])} for m in resolved.mounts]
    mounts += [{"destination": m.container_path, "source": m.host_path, "type": "bind",
                "options": ["rbind", "ro" if m.readonly else "rw", "nosuid", "nodev"]} for m in edit.mounts]
    if mounts:
        adjust["mounts"] = mounts
    if resolved.nodes:
        adjust["linux"] = {"devices": [
            {"path": n.path, "type": n.type, "major": str(n.major), "minor": str(n.minor),
             "fileMode": {"value": n.file_mode}} for n in resolved.nodes]}
    nri_hooks: dict[str, list[dict[str, Any]]] = {}
    for hook in resolved.hooks:
        if (field := _HOOKS.get(hook.get("hookName", ""))) is not None:
            nri_hooks.setdefault(field, []).append(
                {k: hook[k] for k in ("path", "args", "env") if hook.get(k)})
    if nri_hooks:
        adjust["hooks"] = nri_hooks
    return adjust


def runtime_container(container: Mapping[str, Any]) -> hooks.RuntimeContainer:
    """A Container of NRI (Synchronize, or an event) in the core's plain values, its environment with it."""
    return hooks.RuntimeContainer(
        id=container.get("id", ""), name=container.get("name", ""), labels=dict(container.get("labels") or {}),
        annotations=dict(container.get("annotations") or {}), exited=container.get("state") in _STOPPED,
        env=dict(_env(container)),
    )


def sees_a_card(container: Mapping[str, Any], card_nodes: Mapping[tuple[str, int, int], str]) -> bool:
    """Whether a container that is not privileged can reach a card: the NVIDIA hook reads the last
    NVIDIA_VISIBLE_DEVICES of its spec (a legacy CUDA image's, with CUDA_VERSION and no NVIDIA_REQUIRE_CUDA,
    counts as `all` when it names none), or it has our cards' device nodes."""
    if our_devices(container, card_nodes):
        return True
    env = dict(_env(container))  # the last entry of each key, as the hook reads them
    if injection.ENV_VISIBLE_DEVICES not in env:
        return bool(env.get("CUDA_VERSION")) and not env.get("NVIDIA_REQUIRE_CUDA")
    return env[injection.ENV_VISIBLE_DEVICES].strip().lower() not in VISIBLE_NO_CARD


def runtime_containers(containers: Sequence[Mapping[str, Any]]) -> list[hooks.RuntimeContainer]:
    """Each of `containers`, translated."""
    return [runtime_container(c) for c in containers]
