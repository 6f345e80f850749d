"""The elasticgpu controller: binds ElasticGPUClaims to ElasticGPUs, provisions them, releases them.

Modules: `binder` (pure decisions: the state machine), `reservations` (the capacity picture and
GPU status bodies), `kube` (the only module that talks to the API server), `settings`, `errors`.
"""

from elasticgpu.controller.settings import ApiSettings, BindingSettings, ControllerSettings, ResyncSettings

__all__ = ["ApiSettings", "BindingSettings", "ControllerSettings", "ResyncSettings"]
