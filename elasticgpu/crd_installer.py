"""Applies the CRDs to a cluster with server-side apply and waits until they are Established."""

from __future__ import annotations

import time
from collections.abc import Iterator

import yaml
from kubernetes import client, config

from elasticgpu.api import crd
from elasticgpu.api.kinds import KINDS

FIELD_MANAGER = "elasticgpu-crds"


def apply_crds(*, kubeconfig: str | None = None, context: str | None = None, timeout_s: float = 60.0) -> Iterator[str]:
    """Apply every CRD and wait for it to be Established; yields one line per CRD."""
    # The kubernetes client ships no type hints; its ApiClient is typed where we use it.
    api_client: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context
    )
    extensions = client.ApiextensionsV1Api(api_client)
    for info in KINDS:
        body = yaml.safe_load(crd.crd_yaml(info))
        extensions.patch_custom_resource_definition(
            name=info.crd_name,
            body=body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        deadline = time.monotonic() + timeout_s
        while True:
            current = extensions.read_custom_resource_definition(info.crd_name)
            conditions = {c.type: c.status for c in ((current.status and current.status.conditions) or [])}
            if conditions.get("Established") == "True":
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {info.crd_name} not Established after {timeout_s:.0f}s: {conditions}")
            time.sleep(0.2)
        yield f"customresourcedefinition.apiextensions.k8s.io/{info.crd_name} applied and established"
