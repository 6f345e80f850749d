"""bench/pprof_buckets.py reads a pprof CPU profile (a hand-encoded one here: no Go needed) and
puts each sample's time in the bucket of issue 37 that its stack says it is for."""

from __future__ import annotations

import gzip
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def buckets() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pprof_buckets", REPO / "bench" / "pprof_buckets.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["pprof_buckets"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value: int | bytes) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def profile_bytes(samples: list[tuple[list[str], int]]) -> bytes:
    """A profile.proto with sample types (samples, cpu) and one function per distinct name; stacks
    leaf first. Location ids are packed, as Go writes them."""
    strings = ["", "samples", "count", "cpu", "nanoseconds"]
    functions: dict[str, int] = {}
    body = _field(1, _field(1, 1) + _field(2, 2)) + _field(1, _field(1, 3) + _field(2, 4))
    for stack, ns in samples:
        for name in stack:
            if name not in functions:
                functions[name] = len(functions) + 1
                strings.append(name)
        packed = b"".join(_varint(functions[name]) for name in stack)
        body += _field(2, _field(1, packed) + _field(2, _varint(1) + _varint(ns)))
    for name, fid in functions.items():
        body += _field(4, _field(1, fid) + _field(4, _field(1, fid)))  # location id = function id
        body += _field(5, _field(1, fid) + _field(2, strings.index(name)))
    for text in strings:
        body += _field(6, text.encode())
    return body + _field(10, 3_000_000_000)


SERVE = ["net/http.(*conn).serve", "net/http.serverHandler.ServeHTTP"]


def test_samples_land_in_the_bucket_their_stack_is_for(buckets: ModuleType, tmp_path: Path) -> None:
    samples = [
        # CEL under an HTTP handler: CEL, not HTTP.
        (["github.com/google/cel-go/interpreter.(*evalOr).Eval", "k8s.io/apiserver/pkg/cel.Eval", *SERVE], 10_000_000),
        # a GC assist inside managedFields work: GC.
        (["runtime.gcAssistAlloc", "runtime.mallocgc", "sigs.k8s.io/structured-merge-diff/v6/typed.Merge", *SERVE],
         20_000_000),
        # JSON decoding through reflect and the allocator: the leaf's owner is encoding/json.
        (["runtime.mallocgc", "reflect.Value.Set", "encoding/json.(*decodeState).object",
          "k8s.io/apiserver/pkg/endpoints/handlers.createHandler", *SERVE], 30_000_000),
        # a TLS write.
        (["internal/runtime/syscall/linux.Syscall6", "syscall.Write", "internal/poll.(*FD).Write",
          "crypto/tls.(*Conn).Write", *SERVE], 40_000_000),
        # the scheduler's idle loop: only runtime frames.
        (["runtime.futex", "runtime.findRunnable", "runtime.schedule", "runtime.mcall"], 50_000_000),
        # admission logic under HTTP: other (not HTTP: every request runs under net/http).
        (["k8s.io/kubernetes/plugin/pkg/admission/noderestriction.(*Plugin).Admit", *SERVE], 60_000_000),
        # a webhook call under the managedFields admission wrapper (which wraps every admission
        # chain): the webhook's, not managedFields'.
        (["crypto/tls.(*Conn).Write", "k8s.io/apiserver/pkg/admission/plugin/webhook/mutating.(*mutatingDispatcher)"
          ".callAttrMutatingHook", "k8s.io/apiserver/pkg/endpoints/handlers/fieldmanager."
          "(*managedFieldsValidatingAdmissionController).Admit", *SERVE], 70_000_000),
    ]
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(gzip.compress(profile_bytes(samples)))
    profile = buckets.load(str(tmp_path))
    assert profile.total_ns == 280_000_000 and profile.files == 1 and profile.duration_ns == 3_000_000_000
    got = buckets.buckets(profile)
    assert got == {"CEL": 10_000_000, "GC": 20_000_000, "JSON/protobuf encode-decode, unstructured copies": 30_000_000,
                   "HTTP/TLS": 40_000_000, buckets.GO_RUNTIME: 50_000_000, buckets.OTHER: 60_000_000,
                   "admission webhook calls": 70_000_000}  # fmt: skip
    table = buckets.table({"a": profile, "b": profile}, pods=10)
    assert "| CEL | 1.00 (4%) | 1.00 (4%) |" in table, table
    assert "**28.00**" in table, table


def test_several_files_of_one_run_are_summed(buckets: ModuleType, tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / f"cpu-{index:03d}.pb.gz").write_bytes(
            gzip.compress(profile_bytes([(["encoding/json.Marshal", *SERVE], 1_000_000)])))  # fmt: skip
    profile = buckets.load(str(tmp_path))
    assert profile.files == 3 and profile.total_ns == 3_000_000
    with pytest.raises(SystemExit, match="no profile"):
        buckets.load(str(tmp_path / "missing-*.pb.gz"))
