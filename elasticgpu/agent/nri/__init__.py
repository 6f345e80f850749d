"""The NRI front: the agent hooked into the runtime through NRI, beside the CRI proxy (issue 34).

    serving.py      NriFront: the plugin's requests -> the injection core -> its answers; FrontServer
    translating.py  NRI's messages (protojson) <-> the core's plain values (request in, one edit out)
    supervising.py  PluginProcess: the Go plugin (nri-plugin/) as the agent's child, restarted with backoff

The decisions live in the injection core (elasticgpu/agent/injecting), which the CRI front
(elasticgpu/agent/cri) shares; this room never imports that one (an import contract says so).
"""

from elasticgpu.agent.nri.serving import FrontServer, NriFront
from elasticgpu.agent.nri.supervising import PluginProcess, PluginSettings

__all__ = ["FrontServer", "NriFront", "PluginProcess", "PluginSettings"]
