"""NRI's messages (as the plugin relays them, protojson) to and from the injection core's plain values.

    container_request   PodSandbox + Container of a CreateContainer -> injection.ContainerRequest
    adjustment          injection.ContainerEdit -> a ContainerAdjustment (protojson), as a diff of
                        the container the runtime is creating: env and annotations added, replaced
                        or removed (NRI's "-key" marks removal), the edit's mounts, and our CDI
                        devices resolved into device nodes with their device-cgroup rules, their
                        mounts, env and hooks (the NRI of containerd 1.7 and 2.0 takes no CDI names)
    runtime_container   a Container of Synchronize or an event -> hooks.RuntimeContainer

Nothing here decides: serving.py calls these around the core's hooks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from elasticgpu.agent.injecting import cdi, hooks, injection

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


def container_request(pod: Mapping[str, Any], container: Mapping[str, Any]) -> injection.ContainerRequest:
    """The plain view of an NRI CreateContainer that the core reads (the pod from the sandbox; kubelet's
    io.kubernetes.pod.* labels when the sandbox lacks a field)."""
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
        cdi_devices=[],  # resolved by the runtime before NRI is asked: nothing of them is left to strip here
        annotations=dict(container.get("annotations") or {}),
        privileged=privileged(container),
        run_as_user=None,  # not in NRI's Container (v0.6); MPS then serves the image's user
        pod_labels=labels,
        container_id=container.get("id") or None,  # NRI names it before the runtime creates the container
    )


def adjustment(container: Mapping[str, Any], edit: injection.ContainerEdit | None, cdi_dir: Path) -> dict[str, Any]:
    """The ContainerAdjustment (protojson) that turns the container the runtime is creating into the edit's;
    raises cdi.UnresolvedDevice when one of our CDI devices cannot be resolved (the creation is refused)."""
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


def runtime_containers(containers: Sequence[Mapping[str, Any]]) -> list[hooks.RuntimeContainer]:
    """Each of `containers`, translated."""
    return [runtime_container(c) for c in containers]
