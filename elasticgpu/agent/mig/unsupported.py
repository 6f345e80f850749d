"""The claim hooks on a node whose device backend cannot carve MIG instances (NVML today).

A claim of a `partitioning: MIG` class is bound to an instance (`status.partition`); given the
card instead, its container would see a card in MIG mode, which CUDA cannot use, and would hold
more than its reservation. So `MigUnsupported` refuses such a container, saying why and what
to do, after rolling back the claim hooks' row; every other container passes as the claim
hooks decide. `room.MigRoom` installs it where the backend lacks `MigControl`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc

from elasticgpu.agent.injecting import claim_hooks, hooks, injection


class MigUnsupported:
    """hooks.ContainerHooks: the claim hooks, refusing the containers of MIG claims."""

    def __init__(self, *, inner: claim_hooks.ClaimHooks, view: injection.AgentView, backend: str) -> None:
        """`backend`: the device backend's name, for the refusal."""
        self.inner = inner
        self._view = view
        self._backend = backend

    def prepare_create(self, request: injection.ContainerRequest) -> hooks.PreparedCreate:
        """The claim hooks' decision; a MIG claim's container is refused (see the module docstring)."""
        prepared = self.inner.prepare_create(request)
        where = prepared.details.get("claim", "")
        if prepared.token is None or not where:
            return prepared
        namespace, _, name = where.partition("/")
        claim = self._view.claim(namespace, name)
        if claim is None or claim.partition is None:
            return prepared
        self.inner.create_failed(prepared, grpc.StatusCode.FAILED_PRECONDITION)  # the row goes
        profile, start = claim.partition
        raise hooks.Refused(
            f"claim {where} holds the MIG instance {profile} at slice {start} of its card, but the elasticgpu agent"
            f" on node {self._view.node_name} cannot create MIG instances with its {self._backend} device backend"
            " (no MIG calls yet); give the pod a claim of a class without partitioning, or keep MIG classes off"
            " this node with their nodeSelector")

    def created(self, prepared: hooks.PreparedCreate, container_id: str) -> None:
        """As the claim hooks."""
        self.inner.created(prepared, container_id)

    def create_failed(self, prepared: hooks.PreparedCreate, code: grpc.StatusCode) -> None:
        """As the claim hooks."""
        self.inner.create_failed(prepared, code)

    def removed(self, container_id: str) -> None:
        """As the claim hooks."""
        self.inner.removed(container_id)

    def attach_runtime(self, list_containers: Callable[[], Sequence[hooks.RuntimeContainer]]) -> None:
        """As the claim hooks."""
        self.inner.attach_runtime(list_containers)

    def reconcile(self, containers: Sequence[hooks.RuntimeContainer], *, starting: bool) -> None:
        """As the claim hooks."""
        self.inner.reconcile(containers, starting=starting)
