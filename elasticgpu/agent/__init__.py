"""The elasticgpu node agent: discovery, GPU inventory, ledger, usage, health, metrics, CRI hook.

It imports `elasticgpu.api` and never the controller (an import-linter contract enforces it).
"""
