"""The waiting claims in bind order: the picture's side of `decisions.bind_order`.

When capacity frees (a reservation freed, a card back to Ready, a class or node changed) the
picture answers with the keys of the claims that wait; the work queue serves keys in the order
they were added, and the worker plans a batch in that order, so this order decides which claim
gets freed capacity first. This module turns the picture's claims into `bind_order.Waiting`
records (age, cores, class and its `bindOrder`) and, for FairShare classes only, counts the
cores each namespace holds in the class from the reservations the GPUs hold.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from elasticgpu.allocator import Placement
from elasticgpu.api import ElasticGPU, ElasticGPUClaim, ElasticGPUClass
from elasticgpu.api.errors import InvalidRequest
from elasticgpu.controller.decisions import bind_order

ClaimKey = tuple[str, str]
Owner = tuple[str, str]
"""(namespace of the claim, class name) of a claimed ElasticGPU."""


def index_owner(owners: dict[str, Owner], name: str, egpu: ElasticGPU) -> None:
    """Keep `owners[name]` in step with ElasticGPU `egpu` (absent while it has no claimRef: a
    static ElasticGPU reserved while Available belongs to no namespace yet)."""
    ref = egpu.spec.claim_ref
    if ref is not None and ref.namespace:
        owners[name] = (ref.namespace, egpu.spec.elastic_gpu_class_name or "")
    else:
        owners.pop(name, None)


def cores_of(claim: ElasticGPUClaim) -> int:
    """Cores the claim holds once bound (0 when its request is invalid: it cannot bind anyway)."""
    try:
        request, _limit = claim.spec.gpu_request()
    except InvalidRequest:
        return 0
    return request.cores


class CoresCache:
    """Cores of each waiting claim by (namespace, name) and resourceVersion: parsing a claim's
    requests is most of a wake's cost, and a waiting claim is woken many times unchanged."""

    def __init__(self) -> None:
        self._cores: dict[ClaimKey, tuple[str | None, int]] = {}

    def cores(self, key: ClaimKey, claim: ElasticGPUClaim) -> int:
        """`cores_of(claim)`, parsed once per resourceVersion."""
        version = claim.metadata.resource_version
        cached = self._cores.get(key)
        if cached is not None and cached[0] == version and version is not None:
            return cached[1]
        cores = cores_of(claim)
        self._cores[key] = (version, cores)
        return cores

    def keep_only(self, keys: Collection[ClaimKey]) -> None:
        """Forget the claims that no longer wait (called when the cache has grown past them)."""
        if len(self._cores) > 2 * len(keys) + 64:
            self._cores = {key: value for key, value in self._cores.items() if key in keys}


def held_cores(placement: Placement) -> int:
    """Cores a reservation holds (a whole card is 100)."""
    return sum(share.cores for share in placement.cards)


def ordered(
    waiting: Iterable[ClaimKey],
    *,
    claim: Callable[[ClaimKey], ElasticGPUClaim | None],
    classes: Mapping[str, ElasticGPUClass],
    default_class: ElasticGPUClass | None,
    reservations: Mapping[str, Placement],
    owners: Mapping[str, Owner],
    cache: CoresCache | None = None,
    weights: Mapping[str, float] | None = None,
) -> list[ClaimKey]:
    """`waiting` (in the order the picture first saw each wait) in bind order.

    `reservations`: placement by ElasticGPU name (what the GPUs hold); `owners`: namespace and
    class by ElasticGPU name (`index_owner`), read only when a FairShare class has waiting claims;
    `cache`: the picture's `CoresCache`; `weights`: FairShare weight by namespace (absent: 1,
    the Namespace annotation `bind_order.ANNOTATION_FAIR_SHARE_WEIGHT`)."""
    cache = cache or CoresCache()
    records: list[bind_order.Waiting] = []
    fair: set[str] = set()
    preempting: set[ClaimKey] = set()
    for arrival, key in enumerate(waiting):
        model = claim(key)
        if model is None:
            continue
        if model.status.preemption is not None:  # status: only the controller writes it (issue 33)
            preempting.add(key)
        class_name = model.spec.class_name or (default_class.metadata.name or "" if default_class else "")
        klass = classes.get(class_name)
        mode = klass.bind_order if klass is not None else "FIFO"
        if mode == "FairShare":
            fair.add(class_name)
        records.append(bind_order.Waiting(namespace=key[0], name=key[1],
                                          created=model.metadata.creation_timestamp or "", arrival=arrival,
                                          cores=cache.cores(key, model), class_name=class_name, order=mode))
    use = use_by_class(fair, reservations=reservations, owners=owners) if fair else {}
    keys = [w.key for w in bind_order.order(records, use=use, weights=weights)]
    if not preempting:
        return keys
    # A claim that preempted others is tried first: the room its victims free is what it took them for, and
    # an older claim of lower priority that took it would only become its next victim (docs/preemption.md).
    return [k for k in keys if k in preempting] + [k for k in keys if k not in preempting]


def use_by_class(classes: set[str], *, reservations: Mapping[str, Placement],
                 owners: Mapping[str, Owner]) -> dict[str, dict[str, float]]:
    """Cores held per namespace in each of `classes`, from the reservations of claimed
    ElasticGPUs. O(reservations) dictionary reads, no model built: it runs at every wake."""
    use: dict[str, dict[str, float]] = {}
    for name, placement in reservations.items():
        owner = owners.get(name)
        if owner is None or owner[1] not in classes:
            continue
        per_namespace = use.setdefault(owner[1], {})
        per_namespace[owner[0]] = per_namespace.get(owner[0], 0.0) + held_cores(placement)
    return use
