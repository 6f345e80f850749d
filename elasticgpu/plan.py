"""`elasticgpu plan`: bind claims to cards offline, with no cluster.

It reads YAML files holding GPU objects (as the node agent publishes them) or a short node
list, ElasticGPUClasses, ElasticGPUClaims and ElasticGPUQuotas; binds the claims, in file order,
with the allocator under each claim's class and within the quotas of its namespace (the
controller's own check, `allocator.quota`); and prints a kubectl-style table (or, with `-o yaml`, the
ElasticGPUs the controller would create). A claim that stays Pending shows why.

Input is read as strictly as `kubectl apply` with strict field validation reads it: a field the
kind's CRD does not know is an error that names it and what was probably meant
(`api.strict`), never dropped; a value the CRD's schema or CEL rules refuse (a claim of 150 cores,
a resource `gpu-mem`) is an error too (the models' `check`, the same rules), exit 2, whatever
`--strict` says. A claim naming a class that does not exist stays Pending with reason
ClassNotFound, as on a cluster, and the message names the classes there are.

Pods and workloads (Deployment, StatefulSet, ReplicaSet, Job, CronJob, DaemonSet) get the admission
webhook's checks, and their inline requests are planned as the claims the controller would make
(`plan_pods`).

A short node list is a YAML document without `kind` (NODE_LIST_FORMAT; examples/plan/nodes.yaml):

    nodes:
      - {name: node-1, cards: 8, model: A100-SXM4-80GB, memory: 80Gi, cpu: 96, labels: {zone: a}, isolation: [MPS]}
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import yaml
from pydantic import ValidationError

from elasticgpu import plan_mig, plan_pods, plan_resize, user_errors
from elasticgpu.allocator import (
    Allocator,
    CardRecord,
    CardShare,
    Inventory,
    NodeRecord,
    Placement,
    PlacementRequest,
    ReservationConflict,
    Unplaceable,
    quota,
    topology,
)
from elasticgpu.api import (
    GPU,
    ElasticGPU,
    ElasticGPUClaim,
    ElasticGPUClass,
    ElasticGPUError,
    ElasticGPUQuota,
    GpuRequest,
    format_memory,
    names,
    parse_memory_mib,
    strict,
)
from elasticgpu.controller.decisions import binder, capacity

# The sample a newcomer sees first (`elasticgpu plan` with no -f), shipped in the repository.
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plan"

NODE_LIST_FIELDS = ("name", "cards", "model", "memory", "cpu", "hostMemory", "labels", "isolation")
"""The keys of one entry of a short node list; `name` is required."""
NODE_LIST_FORMAT = (
    "a node list is a YAML document `nodes: [{name: node-a, cards: 8, model: NVIDIA A100-SXM4-80GB,"
    " memory: 80Gi, cpu: 96}]` (example: examples/plan/nodes.yaml)"
)
"""How to write a node list, in one line: for the error of an input without cards, and --help."""


@dataclass
class PlanInput:
    """Everything read from the files."""

    gpus: list[GPU]
    node_list: list[dict[str, Any]]
    classes: list[ElasticGPUClass]
    claims: list[ElasticGPUClaim]
    node_labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Labels of the nodes that hold GPU objects (a class's nodeSelector matches them); from a
    cluster's Node objects (`kubectl egpu why`), empty offline."""
    quotas: list[ElasticGPUQuota] = field(default_factory=list)
    pods: list[plan_pods.InputPods] = field(default_factory=list)
    """Pods and workloads, checked as the webhook checks them; their inline claims are in `claims`."""


@dataclass
class ClaimResult:
    """The outcome for one claim: Bound when `placement` is set, else Pending with `reason` (the
    controller's reason word, "" for a claim it leaves alone) and `message`."""

    claim: ElasticGPUClaim
    class_name: str
    request: str
    placement: Placement | None
    message: str
    reason: str = ""
    would_fit: Placement | None = None
    """For a claim that waits for its first consumer: where a pod using it now would get its cards
    (nothing is reserved for it, as on a cluster)."""

    @property
    def phase(self) -> str:
        """Bound or Pending, as the controller would write it."""
        return "Bound" if self.placement is not None else "Pending"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `elasticgpu plan`."""
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="PATH",
        help="YAML file or directory of GPUs (or a node list), classes and claims (repeatable);"
        " default: the bundled sample in examples/plan. A node list is a document"
        " `nodes: [{name: node-a, cards: 8, model: NVIDIA A100-SXM4-80GB, memory: 80Gi, cpu: 96}]`"
        " (examples/plan/nodes.yaml); GPU objects are those of `kubectl get pgpu -o yaml`",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 when any claim stays Pending or any --resize is refused (for scripts and CI gates)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("table", "yaml"),
        default="table",
        help="table of claims (default), or the ElasticGPUs that would be created",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for tie-breaks (results are deterministic)")
    parser.add_argument(
        "--resize",
        action="append",
        metavar="NAMESPACE/CLAIM=SIZE",
        help="after binding, show what resizing this claim would do (repeatable, in order); SIZE is"
        " CORES,MEMORY (60,20Gi), CORES, or cards=N",
    )


def _files(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.iterdir() if p.suffix in {".yaml", ".yml"}))
        else:
            out.append(path)
    return out


USED_KINDS = frozenset({names.KIND_GPU, names.KIND_CLASS, names.KIND_CLAIM, names.KIND_QUOTA, *plan_pods.KINDS})
"""Kinds plan reads; others (ElasticGPUs, Namespaces, Services of a larger manifest) are skipped with a note."""


def _documents(path: Path) -> list[Any]:
    """The YAML documents of one input file, or the file's problem as a user error."""
    try:
        return list(yaml.safe_load_all(path.read_text()))
    except FileNotFoundError:
        raise user_errors.InputFileInvalid(f"-f {path}: no such file or folder") from None
    except (OSError, UnicodeDecodeError) as err:
        raise user_errors.InputFileInvalid(f"-f {path}: cannot be read ({err})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or err
        raise user_errors.InputFileInvalid(f"-f {path}:{line}: not valid YAML ({problem})") from None


def read_inputs(paths: Iterable[str]) -> PlanInput:
    """Parse every document of every file into the kinds `plan` understands."""
    found = PlanInput([], [], [], [])
    for where, doc in _objects(paths):
        if not isinstance(doc, dict):
            raise user_errors.InputFileInvalid(
                f"{where}: not an object; {NODE_LIST_FORMAT}, or a GPU, ElasticGPUClass, ElasticGPUClaim"
                " or ElasticGPUQuota")
        kind = doc.get("kind")
        if kind is not None and kind not in USED_KINDS:
            print(f"note: {where}: kind {kind} is not used by plan; skipped", file=sys.stderr)
            continue
        if kind is not None:
            name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
            where += f" ({kind} {name})" if name else f" ({kind})"
            unknown = strict.unknown_fields(doc) if kind not in plan_pods.KINDS else []  # Kubernetes' own kinds
            if unknown:
                raise user_errors.InputFileInvalid(f"{where}: {', '.join(unknown)}")
        try:
            if kind in plan_pods.KINDS:
                found.pods.append(plan_pods.read(doc, where))
            elif kind is None and "nodes" in doc:
                found.node_list.extend(_node_list(doc, where))
            elif kind == names.KIND_GPU:
                found.gpus.append(_checked(GPU.model_validate(doc)))
            elif kind == names.KIND_CLASS:
                found.classes.append(_checked(ElasticGPUClass.model_validate(doc)))
            elif kind == names.KIND_CLAIM:
                # What the CRD's schema and CEL rules refuse at `kubectl apply` is refused here, not planned.
                found.claims.append(_checked(ElasticGPUClaim.model_validate(doc)))
            elif kind == names.KIND_QUOTA:
                model = ElasticGPUQuota.model_validate(doc)
                model.check()
                # Charges in the file are the cluster's, not this plan's: plan starts from none.
                model.status.charges = []
                found.quotas.append(model)
            else:
                raise ValueError(
                    f"a document without a kind must be a node list: {NODE_LIST_FORMAT}; plan also reads GPU,"
                    " ElasticGPUClass, ElasticGPUClaim and ElasticGPUQuota objects"
                )
        except ValidationError as err:  # pydantic's: told as field and rule, without its text
            raise user_errors.InputFileInvalid(f"{where}: {strict.readable(err)}") from None
        except (ValueError, ElasticGPUError) as err:
            raise user_errors.InputFileInvalid(f"{where}: {err}") from None
    # Inline requests become claims once their pods exist: after the files' claims, as the controller meets them.
    try:
        found.claims.extend(plan_pods.inline_claims(found.pods))
        plan_pods.check_references(found.pods, found.claims)
    except plan_pods.PodInvalid as err:
        raise user_errors.InputFileInvalid(str(err)) from None
    for note in plan_pods.shared_claim_notes(found.pods):
        print(note, file=sys.stderr)
    return found


_Checked = TypeVar("_Checked", GPU, ElasticGPUClass, ElasticGPUClaim)


def _checked(model: _Checked) -> _Checked:
    """`model` once its own `check` (the CRD's rules, the same words) passed; raises InvalidSpec."""
    model.check()
    return model


def _objects(paths: Iterable[str]) -> Iterable[tuple[str, Any]]:
    """(where, object) for every document of every file; a `kind: List` (what `kubectl get
    -o yaml` writes) gives each of its items."""
    for path in _files(paths):
        for number, doc in enumerate(_documents(path), start=1):
            if not doc:
                continue
            where = f"{path} document {number}"
            if isinstance(doc, dict) and doc.get("kind") == "List" and isinstance(doc.get("items"), list):
                for index, item in enumerate(doc["items"]):
                    yield f"{where} items[{index}]", item
            else:
                yield where, doc


def _node_list(doc: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The entries of a node list, each checked as strictly as an object's fields."""
    entries = doc.get("nodes")
    extra = sorted(str(k) for k in doc if k != "nodes")
    if extra:
        raise ValueError(f"unknown field {extra[0]} in a node list; {NODE_LIST_FORMAT}")
    if not isinstance(entries, list):
        raise ValueError(f"nodes: must be a list; {NODE_LIST_FORMAT}")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"nodes[{index}].name: required; {NODE_LIST_FORMAT}")
        for key in entry:
            if key not in NODE_LIST_FIELDS:
                close = difflib.get_close_matches(str(key), NODE_LIST_FIELDS, n=1)
                known = ", ".join(NODE_LIST_FIELDS)
                meant = f"; did you mean nodes[{index}].{close[0]}?" if close else f" (known: {known})"
                raise ValueError(f"unknown field nodes[{index}].{key}{meant}")
    return entries


def build_inventory(found: PlanInput) -> Inventory:
    """Nodes and cards from GPU objects and the node list; GPU reservations restored."""
    inventory = Inventory()
    for entry in found.node_list:
        name = str(entry["name"])
        cpu = entry.get("cpu", 0)
        host_memory = entry.get("hostMemory")
        inventory.add_node(
            NodeRecord(
                name=name,
                cpu_milli=int(float(cpu) * 1000),
                memory_mib=parse_memory_mib(host_memory, field=f"nodes[{name}].hostMemory") if host_memory else 0,
                labels={str(k): str(v) for k, v in (entry.get("labels") or {}).items()},
            )
        )
        memory = parse_memory_mib(entry.get("memory", "16Gi"), field=f"nodes[{name}].memory")
        for i in range(int(entry.get("cards", 1))):
            inventory.add_card(
                CardRecord(
                    uuid=f"GPU-{name}-{i}",
                    node=name,
                    index=i,
                    model=str(entry.get("model", "")),
                    memory_mib=memory,
                    numa=i * 2 // max(int(entry.get("cards", 1)), 1),
                    isolation=frozenset(str(mode) for mode in entry.get("isolation") or []),
                )
            )
    for gpu in found.gpus:
        spec = gpu.spec
        if spec.node_name not in inventory:
            inventory.add_node(NodeRecord(name=spec.node_name, labels=found.node_labels.get(spec.node_name, {})))
        inventory.add_card(plan_mig.soft_record(gpu))  # a card in MIG mode takes MIG claims only
    # Reservations already written into GPU status (the controller's commit point) are kept.
    held: dict[str, list[tuple[GPU, Any]]] = {}
    for gpu in found.gpus:
        for allocation in gpu.status.allocations:
            held.setdefault(allocation.elastic_gpu, []).append((gpu, allocation))
    for key, parts in held.items():
        shares = tuple(
            CardShare(
                uuid=g.spec.uuid,
                cores=names.CORES_PER_CARD if a.exclusive else a.cores,
                memory_mib=g.spec.memory if a.exclusive else a.memory,
                whole=a.exclusive,
            )
            for g, a in parts
        )
        try:
            inventory.reserve(key, Placement(node=parts[0][0].spec.node_name, cards=shares))
        except ReservationConflict as err:
            print(f"warning: {err}", file=sys.stderr)
    return inventory


def _picture(classes: dict[str, ElasticGPUClass], inventory: Inventory) -> binder.Picture:
    """The binder's view of a plan: its classes, no ElasticGPUs (plan provisions; it reads none)."""

    def card_memory(gpu_name: str) -> int | None:
        for node in inventory.nodes():
            for card in node.cards:
                if names.gpu_object_name(card.record.uuid) == gpu_name:
                    return card.record.memory_mib
        return None

    return binder.Picture(elastic_gpus={}, classes=classes, card_memory=card_memory, by_claim_uid={})


def class_for(claim: ElasticGPUClaim, classes: dict[str, ElasticGPUClass]) -> ElasticGPUClass | None:
    """The class that rules `claim`: the one it names, else the default class (the newest, as the
    controller picks it); None when missing."""
    name = claim.spec.class_name
    if name:
        return classes.get(name)
    return binder.Picture(elastic_gpus={}, classes=classes, card_memory=lambda _n: None,
                          by_claim_uid={}).default_class()


def claim_key(claim: ElasticGPUClaim) -> str:
    """The claim's key in the plan's inventory and quota charges: its uid, else namespace/name."""
    return claim.metadata.uid or f"{claim.metadata.namespace or 'default'}/{claim.metadata.name}"


def _as_new(claim: ElasticGPUClaim) -> ElasticGPUClaim:
    """The claim as the controller first sees it: plan predicts a claim's first bind, so what a
    cluster's dump says of its status (Bound, Lost) must not steer the decision."""
    return claim.model_copy(update={"status": type(claim.status)()})


def plan(found: PlanInput, *, seed: int = 0, inventory: Inventory | None = None) -> list[ClaimResult]:
    """Bind every claim in order; returns one result per claim. `inventory`: the one to bind
    into (built from `found` when None); the caller reads the reservations from it afterwards.

    Each verdict comes from the controller's own decisions, in the controller's order:
    `binder.decide_claim` (class found, request valid for the class's provisioner, binding mode),
    then the placement under the class's policy, `capacity.never_fits` (NeverFits or NoCapacity),
    then the namespace's quotas; a WaitForFirstConsumer claim that a pod of the input uses is bound for
    it. What plan cannot know of a cluster: ElasticGPUs (it provisions new ones only), the pods'
    scheduling constraints, preemption by priority, and claim groups."""
    inventory = build_inventory(found) if inventory is None else inventory
    classes = {c.metadata.name: c for c in found.classes if c.metadata.name}
    picture = _picture(classes, inventory)
    allocators: dict[str, Allocator] = {}
    migs = plan_mig.MigPlanner(found.gpus, found.node_labels)  # `partitioning: MIG` classes (plan_mig.py)
    results: list[ClaimResult] = []
    consumed = plan_pods.consumed_claims(found.pods)
    for claim in found.claims:
        gpu_class = class_for(claim, classes)
        class_name = (gpu_class.metadata.name or "") if gpu_class else (claim.spec.class_name or "")
        try:
            shown = claim.spec.gpu_request()[0].describe()
        except ElasticGPUError:
            shown = "-"
        decision = binder.decide_claim(_as_new(claim), picture)
        if isinstance(decision, binder.Ignore):
            results.append(ClaimResult(claim, class_name, shown, None, f"left alone: {decision.why}"))
            continue
        if (isinstance(decision, binder.Wait) and decision.reason == binder.REASON_WAIT_FOR_CONSUMER
                and gpu_class is not None and not gpu_class.is_mig
                and (claim.metadata.namespace or "default", claim.metadata.name or "") in consumed):
            # A pod of the input uses it: the controller binds it for that pod (its other constraints,
            # CPU and memory, node affinity, are the scheduler's: not planned here).
            wanted = _provision_for(claim, gpu_class)
            if wanted is not None:
                result = _provision(claim, wanted, found, inventory, allocators, migs, seed=seed)
                if result.placement is not None:
                    result.message = "; ".join(m for m in ("bound for its pod (WaitForFirstConsumer)", result.message)
                                               if m)
                results.append(result)
                continue
        if isinstance(decision, binder.Wait):
            result = ClaimResult(claim, class_name, shown, None, f"{decision.reason}: {decision.message}",
                                 reason=decision.reason)
            if decision.reason == binder.REASON_WAIT_FOR_CONSUMER and gpu_class is not None:
                result.would_fit = _would_fit(claim, gpu_class, inventory, allocators, seed=seed)
                if result.would_fit is not None:
                    result.message += f"; a pod using it now would get {result.would_fit.describe()}"
            results.append(result)
            continue
        if not isinstance(decision, binder.Provision):
            # Only a claim naming an ElasticGPU gets here (plan reads none): say so rather than guess.
            results.append(ClaimResult(claim, class_name, shown, None, f"plan reads no ElasticGPUs: {decision}"))
            continue
        results.append(_provision(claim, decision, found, inventory, allocators, migs, seed=seed))
    return results


def _allocator(allocators: dict[str, Allocator], inventory: Inventory, policy: str, seed: int) -> Allocator:
    allocator = allocators.get(policy)
    if allocator is None:
        allocator = allocators[policy] = Allocator(inventory, policy=policy, seed=seed)
    return allocator


def _placement_request(decision: binder.Provision) -> PlacementRequest:
    # As flow/binding/reserving.py builds it: the class's isolation only for a slice, never for whole cards.
    return PlacementRequest(gpu=decision.request, models=tuple(decision.parameters.gpu_model),
                            node_selector=decision.parameters.node_selector,
                            isolation=decision.required_isolation, topology=decision.topology)


def _provision_for(claim: ElasticGPUClaim, gpu_class: ElasticGPUClass) -> binder.Provision | None:
    """The binder's Provision of a claim under `gpu_class`, for a WaitForFirstConsumer claim (whose
    request the binder already found valid for the class); None when it cannot be read."""
    try:
        request, _limit = claim.spec.gpu_request()
        parameters = gpu_class.parsed_parameters()
    except ElasticGPUError:
        return None
    return binder.Provision(class_name=gpu_class.metadata.name or "", provisioner=gpu_class.provisioner,
                            request=request, parameters=parameters,
                            reclaim_policy=gpu_class.effective_reclaim_policy, isolation=gpu_class.isolation,
                            topology=gpu_class.topology)


def _would_fit(claim: ElasticGPUClaim, gpu_class: ElasticGPUClass, inventory: Inventory,
               allocators: dict[str, Allocator], *, seed: int) -> Placement | None:
    """Where a WaitForFirstConsumer claim would go now (nothing reserved), or None."""
    if gpu_class.is_mig:
        return None
    decision = _provision_for(claim, gpu_class)
    if decision is None:
        return None
    placed = _allocator(allocators, inventory, decision.parameters.policy, seed).place(_placement_request(decision))
    return placed if isinstance(placed, Placement) else None


def _provision(claim: ElasticGPUClaim, decision: binder.Provision, found: PlanInput, inventory: Inventory,
               allocators: dict[str, Allocator], migs: plan_mig.MigPlanner, *, seed: int) -> ClaimResult:
    """A claim the binder would provision: place it (NeverFits or NoCapacity when nowhere), then charge its quotas."""
    key, class_name, shown = claim_key(claim), decision.class_name, decision.request.describe()
    gpu_class = next((c for c in found.classes if c.metadata.name == class_name), None)
    if gpu_class is not None and gpu_class.is_mig:
        mig = migs.allocate(key, decision.request, decision.parameters)
        if isinstance(mig, plan_mig.MigPending):
            reason = capacity.REASON_NEVER_FITS if mig.never else binder.REASON_NO_CAPACITY
            return ClaimResult(claim, class_name, shown, None, f"{reason}: {mig.reason}", reason=reason)
        placement: Placement = mig
        release: Callable[[str], object] = migs.release
    else:
        request = _placement_request(decision)
        allocator = _allocator(allocators, inventory, decision.parameters.policy, seed)
        result = allocator.allocate(key, request)
        if isinstance(result, Unplaceable):
            never = capacity.never_fits(inventory, decision.request, models=request.models,
                                        node_selector=request.node_selector)
            if never:
                return ClaimResult(claim, class_name, shown, None, f"{capacity.REASON_NEVER_FITS}: {never}",
                                   reason=capacity.REASON_NEVER_FITS)
            message = capacity.no_capacity_message(decision.request, result)
            return ClaimResult(claim, class_name, shown, None, f"{binder.REASON_NO_CAPACITY}: {message}",
                               reason=binder.REASON_NO_CAPACITY)
        placement, release = result, allocator.release
    over = _charge(found.quotas, claim, key, class_name, placement)
    if over is not None:
        release(key)
        return ClaimResult(claim, class_name, shown, None, f"{over[0]}: {over[1]}", reason=over[0])
    note = migs.describe(key)
    if not note and (len(placement.cards) > 1 or placement.nics):
        # Several whole cards (or NICs): say how they are joined, what the class's topology is about.
        note = topology.describe([inventory.card(u) for u in placement.uuids], placement.nics)
    return ClaimResult(claim, class_name, shown, placement, note)


def _charge(quotas: list[ElasticGPUQuota], claim: ElasticGPUClaim, key: str, class_name: str,
            placement: Placement) -> tuple[str, str] | None:
    """Charge a placed claim to the quotas of its namespace, as the controller does before it
    reserves; returns (reason, message) of why it stays Pending, or None when it was charged."""
    namespace = claim.metadata.namespace or "default"
    mine = [q for q in quotas if (q.metadata.namespace or "default") == namespace]
    amount = quota.amount_of(placement)
    verdict = quota.check(mine, uid=key, class_name=class_name, amount=amount)
    if isinstance(verdict, quota.Exceeded | quota.Unreadable):
        reason = quota.REASON_QUOTA_EXCEEDED if isinstance(verdict, quota.Exceeded) else quota.REASON_INVALID_QUOTA
        return reason, verdict.message
    charge = quota.charge_for(claim=claim.metadata.name or "", uid=key, class_name=class_name, amount=amount)
    for model in mine:
        model.status.charges = [*model.status.charges, charge]
    return None


def _capacity(request: GpuRequest, placement: Placement) -> dict[str, int | str]:
    if request.is_whole:
        return {names.RESOURCE_NVIDIA_GPU: request.cards}
    share = placement.cards[0]
    return {names.RESOURCE_CORE: share.cores, names.RESOURCE_MEMORY: format_memory(share.memory_mib)}


def elastic_gpus(results: list[ClaimResult], classes: list[ElasticGPUClass]) -> list[ElasticGPU]:
    """The ElasticGPUs the controller would create for the bound claims."""
    by_name = {c.metadata.name: c for c in classes}
    out = []
    for r in results:
        if r.placement is None:
            continue
        claim = r.claim
        request, _ = claim.spec.gpu_request()
        gpu_names = [names.gpu_object_name(u) for u in r.placement.uuids]
        uid = claim.metadata.uid or f"{claim.metadata.namespace or 'default'}-{claim.metadata.name}"
        gpu_class = by_name.get(r.class_name)
        spec: dict[str, Any] = {
            "capacity": _capacity(request, r.placement),
            "claimRef": {
                "apiVersion": names.API_VERSION,
                "kind": names.KIND_CLAIM,
                "namespace": claim.metadata.namespace or "default",
                "name": claim.metadata.name,
                "uid": claim.metadata.uid,
            },
            "nodeName": r.placement.node,
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [r.placement.node]}
                            ]
                        }
                    ]
                }
            },
            "elasticGPUClassName": r.class_name or None,
            "reclaimPolicy": gpu_class.effective_reclaim_policy if gpu_class else None,
        }
        if request.is_whole:
            spec["physicalGPU"] = {"gpuNames": gpu_names}
            if r.placement.nics:
                spec["physicalGPU"]["rdmaNics"] = list(r.placement.nics)
        else:
            spec["gpuShare"] = {"gpuName": gpu_names[0]}
        out.append(
            ElasticGPU.model_validate(
                {
                    "metadata": {"name": names.elastic_gpu_name_for_claim(uid).replace("/", "-")},
                    "spec": {k: v for k, v in spec.items() if v is not None},
                }
            )
        )
    return out


def print_table(results: list[ClaimResult], out: TextIO) -> None:
    """kubectl-style columns; the message of a Pending claim is its explanation."""
    rows = [("NAMESPACE", "NAME", "STATUS", "CLASS", "REQUEST", "NODE", "GPUS", "MESSAGE")]
    for r in results:
        placement = r.placement
        rows.append(
            (
                r.claim.metadata.namespace or "default",
                r.claim.metadata.name or "",
                "Bound" if placement else "Pending",
                r.class_name or "<none>",
                r.request,
                placement.node if placement else "<none>",
                ",".join(placement.uuids) if placement else "<none>",
                r.message,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        out.write(("   ".join(cells) + "   " + row[-1]).rstrip() + "\n")


def run(args: argparse.Namespace) -> int:
    """Run `elasticgpu plan`; exit 0, or with `--strict` 1 when some claim stays Pending."""
    found = read_inputs(args.filename or [str(SAMPLE)])
    if not found.gpus and not found.node_list:
        raise user_errors.InputFileInvalid(
            f"no GPU objects and no node list in {', '.join(args.filename or [str(SAMPLE)])}: add one;"
            f" {NODE_LIST_FORMAT}, or pass the output of `kubectl get pgpu -o yaml` with -f"
        )
    asks = [plan_resize.parse(text) for text in args.resize or []]  # a typo is told before any work
    inventory = build_inventory(found)
    results = plan(found, seed=args.seed, inventory=inventory)
    resized = plan_resize.decide_all(asks, _bound(results, found.classes), inventory, found.quotas) if asks else []
    if args.output == "yaml":
        # Without status, as the controller creates them; to_dict drops empty maps and lists.
        docs = [
            {k: v for k, v in e.to_dict().items() if k != "status"} for e in elastic_gpus(results, found.classes)
        ]
        sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False) if docs else "")
        for r in results:
            if r.placement is None:
                print(f"# {r.claim.metadata.name} stays Pending: {r.message}", file=sys.stderr)
        for r2 in resized:
            print(f"# resize {r2.ask.namespace}/{r2.ask.name}={r2.ask.text}: {r2.outcome}: {r2.message}",
                  file=sys.stderr)
    else:
        print_table(results, sys.stdout)
        if resized:
            sys.stdout.write("\n")
            plan_resize.print_table(resized, sys.stdout)
    pending = sum(1 for r in results if r.placement is None) + plan_resize.refused(resized)
    return 1 if args.strict and pending else 0


def _bound(results: list[ClaimResult], classes: list[ElasticGPUClass]
           ) -> dict[tuple[str, str], plan_resize.Bound | None]:
    """Every planned claim by (namespace, name): its placement, or None when it stays Pending."""
    resizable = {c.metadata.name for c in classes if c.allow_claim_resize}
    return {
        (r.claim.metadata.namespace or "default", r.claim.metadata.name or ""): (
            plan_resize.Bound(r.claim, claim_key(r.claim), r.class_name, r.placement, r.class_name in resizable)
            if r.placement
            else None
        )
        for r in results
    }


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (`python -m elasticgpu.plan`)."""
    parser = argparse.ArgumentParser(prog="elasticgpu plan", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
