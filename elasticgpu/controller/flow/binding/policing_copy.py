"""The class's over-limit policy in a Bound claim's status (issue 25): `status.policing`; and whether
privileged containers may use the claim (issue 33.4): `status.allowPrivileged`, kept the same way.

The node agent polices the claims of its node, but it may read only claims and ElasticGPUs
(deploy/agent.yaml; classes are cluster configuration it has no business listing). So the
controller copies the class's `overLimitAction` and `overLimitGraceSeconds` into the claim's
`status.policing`: with the bind (`ClaimStatus.bound`'s write carries it, so no container of the
claim ever runs before its policy is there), and afterwards whenever the binder finds the claim
in sync and the class now says otherwise (an admin changed the class: its Bound claims follow,
at the next sync, as a policy should). A claim whose class is gone keeps what it had; a claim
without a class has no `status.policing` and is only warned about (the agent's default).

Write: the claim's status, with its resourceVersion. A 409 re-reads the claim and raises; the
worker retries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass
from elasticgpu.controller import errors
from elasticgpu.controller.decisions import binder, bound_class
from elasticgpu.controller.edge.kube import KubeApi
from elasticgpu.controller.picture.picture import Picture

logger = logging.getLogger(__name__)


def wanted(claim: ElasticGPUClaim, egpu: ElasticGPU, classes: Mapping[str, ElasticGPUClass]) -> dict[str, Any] | None:
    """The `status.policing` the claim should show (its class's policy), or None when it has no class."""
    klass = bound_class.class_of(claim, egpu, classes)
    return klass.over_limit_policy.to_dict(prune_empty=False) if klass is not None else None


def wanted_privileged(claim: ElasticGPUClaim, egpu: ElasticGPU, classes: Mapping[str, ElasticGPUClass]) -> bool | None:
    """The claim's `status.allowPrivileged`: True when its class allows privileged containers, else None (absent)."""
    klass = bound_class.class_of(claim, egpu, classes)
    return True if klass is not None and klass.allow_privileged else None


def shown(claim: ElasticGPUClaim) -> dict[str, Any] | None:
    """The claim's `status.policing` as it is now (None when absent)."""
    return claim.status.policing.to_dict(prune_empty=False) if claim.status.policing is not None else None


class PolicingCopy:
    """Keeps a Bound claim's `status.policing` true to its class (see the module docstring)."""

    def __init__(self, *, kube: KubeApi, picture: Picture) -> None:
        self.kube = kube
        self.picture = picture

    def sync(self, namespace: str, name: str, egpu_name: str) -> None:
        """Write the class's policy into the claim's status when it differs; nothing when it is there."""
        with self.picture.lock:
            claim = self.picture.claim(namespace, name)
            egpu = self.picture.egpu(egpu_name)
            if claim is None or egpu is None or not binder.is_bound(claim):
                return
            classes = self.picture.view().classes
            want = wanted(claim, egpu, classes)
            klass = bound_class.class_of(claim, egpu, classes)
            privileged = wanted_privileged(claim, egpu, classes)
        status: dict[str, Any] = {}
        if want is not None and want != shown(claim):
            status["policing"] = want
        if klass is not None and privileged != (claim.status.allow_privileged or None):
            status["allowPrivileged"] = privileged  # the class changed: its Bound claims follow (issue 33.4)
        if not status:
            return  # no class (or it is gone: the claim keeps its copy), or already true to it
        patch = {"metadata": {"resourceVersion": claim.metadata.resource_version}, "status": status}
        try:
            answer = self.kube.patch_claim_status(namespace, name, patch)
        except errors.NotFound:
            return  # deleted meanwhile
        except errors.Conflict:
            # The agent wrote the usage meanwhile: re-read, and the worker's retry decides again.
            self.picture.put_claim(self.kube.get_claim(namespace, name))
            raise
        self.picture.put_claim(answer)
        logger.info("claim %s/%s: %s from its class", namespace, name, status)
