"""Where a Go process's CPU went, in the buckets of issue 37: CPU profiles (pprof `profile.pb.gz`,
e.g. kube-apiserver's /debug/pprof/profile) attributed by function names, ms per pod side by side.

Every sample's whole stack (inlined frames included) is matched in two steps:

1. reasons, in order, any frame of the stack: GC (a mark assist inside a CEL call is still GC),
   managedFields, CEL, CR schema work, watch (decode, cache, fan-out), admission webhook calls,
   the etcd client, and the bench's own probes (/metrics, pprof); the first that matches takes it;
2. else the work itself: the leaf-most frame that is not the Go runtime or the standard library's
   generic helpers (reflect, strconv, sync, ...) decides between encode/decode and copies, HTTP/TLS
   (net, crypto, syscalls) and `other`; a stack of nothing but runtime frames is `Go runtime`.
   (Every request runs under net/http, so "any frame" would put all of it in HTTP/TLS.)

    python bench/pprof_buckets.py --pods 800 ours-slice=out/ours-slice-r1 dra-one=out/dra-one-r1
    python bench/pprof_buckets.py --pods 800 --top 15 --bucket other ours-slice=out/ours-slice-r1/*.pb.gz

A profile is one file, several files (a run captured in windows: their samples are summed), a
folder (its *.pb.gz) or a glob; give several as LABEL=A,B. No Go toolchain is needed (the
profile's own symbol table is read); `go tool pprof -top FILES` gives the flat view.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# fmt: off
BUCKETS: list[tuple[str, re.Pattern[str]]] = [
    ("GC", re.compile(r"^runtime\.(gcBgMarkWorker|gcAssistAlloc|gcDrain|bgsweep|bgscavenge|sweepone|markroot"
                      r"|gcMarkDone|gcStart|deductSweepCredit)")),
    # managedFieldsValidatingAdmissionController wraps the whole admission chain: not its frame.
    ("managedFields", re.compile(r"structured-merge-diff|/fieldmanager\.(?!\(\*managedFieldsValidatingAdmission)"
                                 r"|/util/managedfields|/internal/managedfields")),
    ("CEL", re.compile(r"github\.com/google/cel-go|k8s\.io/apiserver/pkg/cel|/apiserver/schema/cel"
                       r"|/admission/plugin/cel|/plugin/policy/|matchconditions")),
    # Not customresource.(*StatusREST).Update nor schemaCoercingDecoder.Decode: they wrap the whole
    # status write and the body's JSON decode; their strategies and the coercer are the schema work.
    ("CR schema (coercion, defaulting, pruning, OpenAPI validation)",
     re.compile(r"apiextensions-apiserver/pkg/apiserver/schema|apiextensions-apiserver/pkg/apiserver/validation"
                r"|apiextensions-apiserver/pkg/registry/customresource\.(customResourceStrategy|statusStrategy"
                r"|customResourceValidator|validateKubeFinalizerName|generateWarnings)"
                r"|apiextensions-apiserver/pkg/apiserver\.(\(\*unstructuredSchemaCoercer\)|schemaCoercingConverter"
                r"|unstructuredDefaulter)|kube-openapi/pkg/validation|apiextensions-apiserver/pkg/apihelpers")),
    # Not cacher.(*CacheDelegator): every write and get passes through it on its way to etcd.
    ("watch (decode, cache, fan-out)", re.compile(r"/storage/cacher\.(?!\(\*CacheDelegator\))|/storage/cacher/"
                                                  r"|\(\*WatchServer\)|handlers\.serveWatch"
                                                  r"|/storage/etcd3\.\(\*watch|watch\.\(\*StreamWatcher"
                                                  r"|apimachinery/pkg/watch\.")),
    ("admission webhook calls", re.compile(r"/admission/plugin/webhook")),
    ("etcd client (gRPC)", re.compile(r"go\.etcd\.io/etcd|google\.golang\.org/grpc")),
    ("bench probes (/metrics, pprof)", re.compile(r"prometheus/common/expfmt|prometheus/client_golang/prometheus\."
                                                 r"\(\*Registry\)\.Gather|^runtime/pprof|net/http/pprof")),
]
LEAF_BUCKETS: list[tuple[str, re.Pattern[str]]] = [
    ("JSON/protobuf encode-decode, unstructured copies",
     re.compile(r"^encoding/json|sigs\.k8s\.io/json|json-iterator|/apis/meta/v1/unstructured|DeepCopy"
                r"|/runtime/serializer|gogo/protobuf|google\.golang\.org/protobuf|/util/json|^encoding/")),
    ("HTTP/TLS", re.compile(r"^net/http|^crypto/|golang\.org/x/net/http2|^net\.|^internal/poll|^syscall"
                            r"|^internal/runtime/syscall|^vendor/golang\.org/x/crypto|^p256|^bufio")),
]
# Frames that say nothing about what the work is for: skipped when looking for the leaf's owner.
GENERIC = re.compile(r"^(runtime\.|internal/(?!poll|runtime/syscall)|sync\.|sync/|reflect\.|strconv\.|bytes\."
                     r"|strings\.|unicode|sort\.|slices\.|maps\.|math|hash|errors\.|fmt\.|memeqbody|indexbyte"
                     r"|aeshash|cmpbody|gcWriteBarrier|time\.runtimeNow|time\.Now|context\.)")
# fmt: on
GO_RUNTIME = "Go runtime (scheduler, allocation)"
OTHER = "other"


@dataclass
class Profile:
    """CPU nanoseconds per stack (leaf first), summed over one or more profile files."""

    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)
    duration_ns: int = 0
    files: int = 0

    @property
    def total_ns(self) -> int:
        return sum(self.stacks.values())


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message: ints for varints, bytes otherwise."""
    i, end = 0, len(buf)
    while i < end:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            yield number, wire, value
        elif wire == 2:
            size, i = _varint(buf, i)
            yield number, wire, buf[i : i + size]
            i += size
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's entries, packed or not."""
    if isinstance(value, int):
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


def read_profile(path: Path, into: Profile) -> None:
    """Add one pprof profile (gzipped or not) to `into`, by the value of type `cpu`."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    strings: list[str] = []
    value_types: list[tuple[int, int]] = []
    samples: list[tuple[list[int], list[int]]] = []
    locations: dict[int, list[int]] = {}
    functions: dict[int, int] = {}
    for number, _, value in _fields(data):
        if number == 6 and isinstance(value, bytes):
            strings.append(value.decode("utf-8", "replace"))
        elif number == 1 and isinstance(value, bytes):
            kinds = dict((n, v) for n, _, v in _fields(value))
            value_types.append((int(kinds.get(1, 0)), int(kinds.get(2, 0))))  # type: ignore[arg-type]
        elif number == 2 and isinstance(value, bytes):
            ids: list[int] = []
            values: list[int] = []
            for n, _, v in _fields(value):
                if n == 1:
                    ids += _ints(v)
                elif n == 2:
                    values += _ints(v)
            samples.append((ids, values))
        elif number == 4 and isinstance(value, bytes):
            loc_id, funcs = 0, []
            for n, _, v in _fields(value):
                if n == 1 and isinstance(v, int):
                    loc_id = v
                elif n == 4 and isinstance(v, bytes):
                    funcs += [int(fv) for fn, _, fv in _fields(v) if fn == 1]  # type: ignore[arg-type]
            locations[loc_id] = funcs
        elif number == 5 and isinstance(value, bytes):
            parts = {n: v for n, _, v in _fields(value)}
            functions[int(parts.get(1, 0))] = int(parts.get(2, 0))  # type: ignore[arg-type]
        elif number == 10 and isinstance(value, int):
            into.duration_ns += value
    names = [strings[i] for i, _ in value_types]
    column = names.index("cpu") if "cpu" in names else len(names) - 1
    for ids, values in samples:
        stack = tuple(strings[functions.get(f, 0)] for loc in ids for f in locations.get(loc, []))
        into.stacks[stack] += values[column]
    into.files += 1


def load(spec: str) -> Profile:
    """A profile from `A,B,...`: files, folders (their *.pb.gz) or globs, summed."""
    profile = Profile()
    for part in spec.split(","):
        path = Path(part)
        matches = sorted(path.glob("*.pb.gz")) if path.is_dir() else [Path(p) for p in sorted(glob.glob(part))]
        if not matches:
            raise SystemExit(f"no profile at {part}")
        for match in matches:
            read_profile(match, profile)
    return profile


def bucket_of(stack: tuple[str, ...]) -> str:
    """The first reason bucket with a frame of `stack` matching it, else the bucket of the
    leaf-most frame that is not generic (see the module's docstring)."""
    for name, pattern in BUCKETS:
        if any(pattern.search(frame) for frame in stack):
            return name
    owner = next((frame for frame in stack if not GENERIC.search(frame)), None)
    if owner is None:
        return GO_RUNTIME
    for name, pattern in LEAF_BUCKETS:
        if pattern.search(owner):
            return name
    return OTHER


def buckets(profile: Profile) -> Counter[str]:
    """CPU nanoseconds per bucket."""
    out: Counter[str] = Counter()
    for stack, ns in profile.stacks.items():
        out[bucket_of(stack)] += ns
    return out


def top_functions(profile: Profile, bucket: str, count: int) -> list[tuple[str, int]]:
    """The functions that decided `bucket` for its samples with the most CPU: the leaf-most frame
    not generic (the runtime's own frames where there is none)."""
    flat: Counter[str] = Counter()
    for stack, ns in profile.stacks.items():
        if stack and bucket_of(stack) == bucket:
            flat[next((frame for frame in stack if not GENERIC.search(frame)), stack[0])] += ns
    return flat.most_common(count)


def table(profiles: dict[str, Profile], pods: int) -> str:
    """A markdown table: ms of CPU per pod per bucket, one column per profile (and its share)."""
    per = {label: buckets(p) for label, p in profiles.items()}
    order = [name for name, _ in [*BUCKETS, *LEAF_BUCKETS]] + [GO_RUNTIME, OTHER]
    lines = ["| bucket | " + " | ".join(f"{label} ms/pod (%)" for label in profiles) + " |",
             "|---|" + "---|" * len(profiles)]  # fmt: skip
    for name in order:
        cells = []
        for label, p in profiles.items():
            total = p.total_ns or 1
            cells.append(f"{per[label][name] / 1e6 / pods:.2f} ({100 * per[label][name] / total:.0f}%)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| **total sampled** | " + " | ".join(f"**{p.total_ns / 1e6 / pods:.2f}**" for p in profiles.values())
                 + " |")  # fmt: skip
    lines.append("| profiled s (files) | " + " | ".join(f"{p.duration_ns / 1e9:.1f} ({p.files})"
                                                      for p in profiles.values()) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", metavar="LABEL=PATHS", help="a label and its profile files")
    parser.add_argument("--pods", type=int, default=1, help="pods in each profiled run (ms per pod); 1: ms in all")
    parser.add_argument("--top", type=int, default=0, help="also list the top functions of --bucket")
    parser.add_argument("--bucket", default=OTHER, help=f"the bucket --top lists (default {OTHER})")
    args = parser.parse_args(argv)
    profiles: dict[str, Profile] = {}
    for spec in args.profiles:
        label, sep, paths = spec.partition("=")
        if not sep:
            label, paths = Path(spec).name, spec
        profiles[label] = load(paths)
    print(table(profiles, args.pods))
    if args.top:
        for label, profile in profiles.items():
            print(f"\n{label}: top {args.top} functions (leaf-most not generic) of bucket {args.bucket!r} (ms per pod)")
            for name, ns in top_functions(profile, args.bucket, args.top):
                print(f"  {ns / 1e6 / args.pods:8.3f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
