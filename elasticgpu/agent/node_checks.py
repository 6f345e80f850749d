"""What the agent reads on its node, beside kubelet: live GPU device plugins and the container toolkit's setting.

- `live_device_plugin_sockets`: the sockets of kubelet's device-plugin folder that answer a connection
  (a plugin that ended leaves its file behind until kubelet cleans up; only a listener is an allocator).
- `toolkit_exposure`: whether the NVIDIA container toolkit honours `NVIDIA_VISIBLE_DEVICES` of an
  unprivileged container (`accept-nvidia-visible-devices-envvar-when-unprivileged`, true when absent: the
  toolkit's default). While it does, a container created when no node hook is registered (NRI fails open)
  and whose image says `NVIDIA_VISIBLE_DEVICES=all` gets every card of the node.
Both read node paths under the agent's view of the node's root (`host_root`).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ENVVAR_SETTING = "accept-nvidia-visible-devices-envvar-when-unprivileged"
CONNECT_TIMEOUT_S = 0.5


def under(host_root: str, node_path: str) -> Path:
    """A node path as the agent sees it (`/host` + `/var/lib/...`)."""
    return Path(host_root) / node_path.lstrip("/")


def live_device_plugin_sockets(folder: Path) -> list[str]:
    """Names of the unix sockets in `folder` that accept a connection now; [] when the folder is missing."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    live = []
    for entry in entries:
        try:
            if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                continue
        except OSError:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(CONNECT_TIMEOUT_S)
            try:
                probe.connect(entry.path)
            except (ConnectionRefusedError, FileNotFoundError):
                continue  # nobody listens: a file left behind by a plugin that ended
            except OSError:
                pass  # a listener that does not accept now (its backlog full, slow): live all the same
            live.append(entry.name)
    return live


@dataclass(frozen=True)
class ToolkitExposure:
    """The container toolkit's answer to "does it honour NVIDIA_VISIBLE_DEVICES of unprivileged containers"."""

    exposed: bool | None
    """True: it does (the fail-open window is open); False: it does not; None: no toolkit config was found."""
    config: str
    """The node path of the config file that says so ("" when none was found)."""
    message: str


def toolkit_exposure(host_root: str, configs: str) -> ToolkitExposure:
    """Read the first of `configs` (comma-separated node paths) that exists."""
    paths = [p.strip() for p in configs.split(",") if p.strip()]
    for node_path in paths:
        path = under(host_root, node_path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        except OSError as e:
            return ToolkitExposure(None, node_path, f"{node_path} cannot be read ({e.strerror})")
        try:
            value = tomllib.loads(text).get(ENVVAR_SETTING, True)
        except tomllib.TOMLDecodeError as e:
            return ToolkitExposure(None, node_path, f"{node_path} is not TOML ({e})")
        if value is False:
            return ToolkitExposure(False, node_path, f"{node_path}: {ENVVAR_SETTING} = false: an unprivileged"
                                   " container's NVIDIA_VISIBLE_DEVICES is ignored; no card without the node hook")
        return ToolkitExposure(True, node_path, (
            f"{node_path}: {ENVVAR_SETTING} is {'true' if value is True else repr(value)}"
            f"{' (the default: absent)' if ENVVAR_SETTING not in text else ''}: while the node hook is not"
            " registered (agent restarting, NRI fails open) a container whose image sets NVIDIA_VISIBLE_DEVICES=all"
            f" gets every card; set {ENVVAR_SETTING} = false (docs/admin-guide.md, \"The container toolkit's"
            " fail-open setting\")"))
    return ToolkitExposure(None, "", f"no NVIDIA container toolkit config at {', '.join(paths)}: the toolkit's"
                           " setting is unknown here (set ELASTICGPU_AGENT_TOOLKIT_CONFIGS to its path)")
