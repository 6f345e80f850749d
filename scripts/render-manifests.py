"""Renders the plain manifests of deploy/ from the Helm chart deploy/chart, or your own.

    .venv/bin/python scripts/render-manifests.py          # rewrite deploy/*.yaml and deploy/policies/
    .venv/bin/python scripts/render-manifests.py --check  # exit 1 if they differ from the chart

Your values, without helm (as `helm template` would render them, into a folder of your own):

    .venv/bin/python scripts/render-manifests.py -f my-values.yaml \
        --set image.repository=registry.example.com/elasticgpu --set image.tag=0.1.0 --out my-manifests
    kubectl apply --server-side -f my-manifests/crds/ && kubectl apply -f my-manifests/ -f my-manifests/policies/

`-f FILE` (repeatable) and `--set key=value` (repeatable; `a.b=1,c=x`, `a\\.b` for a dot in a key,
`{x,y}` for a list; true/false/null and integers are typed as Helm types them) are merged over the
chart's defaults in the order given, `--set` last, as Helm does; a key the chart's values.yaml
does not have is told on stderr (Helm would ignore it silently). `--out DIR` gets the same files as
deploy/ plus the CRDs in DIR/crds/; deploy/ itself only ever holds the defaults.

The chart is the source: edit deploy/chart/templates/, then run this. Helm renders the chart with its
default values plus `namespace.create=true` (each plain file carries the Namespace, so it applies on
its own), release elasticgpu in elasticgpu-system; the renderer is Helm itself, in-process (the
`helm-python-sdk` package of the `manifests` extra, in the test extra too: Helm's engine as a library,
no helm binary).

    templates/X.yaml         -> deploy/X.yaml (none when it renders no object, e.g. a switch that is off;
                                but agent-installer.yaml, the other node hook, is rendered with
                                agent.nodeHook=cri-proxy: PLAIN_VARIANTS)
    templates/policies.yaml  -> deploy/policies/F.yaml, one per "# file: policies/F.yaml" section
                                (the chart reads those files through files/policies, so they come back as
                                they are: drop a new policy file into deploy/policies/ and it is in the chart)
    templates/helm-*.yaml    -> nothing (Helm only: hooks)

Comment lines do not count when comparing (tests/deploy/test_chart.py neither); this script does not
import elasticgpu.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

try:
    import helm_python
    from helm_python import _native as helm_native
except ModuleNotFoundError as missing:
    if missing.name != "helm_python":
        raise
    # Helm's engine is 240 MB: scripts/run.sh leaves it out of the .venv it makes, so the README's
    # command for it installs the `manifests` extra first. Said in one line, not a traceback.
    sys.exit(f"{sys.argv[0]}: needs Helm's engine as a library (the helm-python-sdk package, about 240 MB), which"
             f" {sys.executable} lacks: install it with `{Path(sys.executable).parent}/pip install -e '.[manifests]'`"
             " (from the repository root), then run this again")

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "chart"
DEPLOY = ROOT / "deploy"
RELEASE = "elasticgpu"
NAMESPACE = "elasticgpu-system"
PLAIN_VALUES = {"namespace": {"create": True}}
"""The chart's defaults plus these: the values of the plain manifests."""
PLAIN_VARIANTS: dict[str, dict[str, object]] = {"agent-installer.yaml": {"agent": {"nodeHook": "cri-proxy"}}}
"""Templates the defaults do not render whose plain file deploy/ still carries, rendered with these values
over PLAIN_VALUES: the node hook the defaults did not choose (agent.nodeHook), so that a user of the plain
manifests picks deploy/agent-daemonset.yaml (NRI) or deploy/agent-installer.yaml (the CRI proxy's host service)."""
HEADER = "# Rendered from deploy/chart/templates/{name} by scripts/render-manifests.py: edit the template.\n"
FILE_MARKER = re.compile(r"^# file: (policies/[A-Za-z0-9._-]+\.yaml)\n", re.MULTILINE)


def significant(text: str) -> list[str]:
    """The lines that make up the objects: no comment lines, no blank lines."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _has_objects(text: str) -> bool:
    return any(line.strip() != "---" for line in significant(text))


def _tidy(text: str) -> str:
    # Templates that start with a condition leave blank lines before the first comment.
    return text.strip("\n") + "\n"


GO_INFO_LINE = re.compile(r"^[0-9]{4}/[0-9]{2}/[0-9]{2} [0-9:]{8} INFO ")
"""A line of Go's default logger at INFO, as Helm's chart loader writes it for each link in the chart."""


@contextlib.contextmanager
def _without_go_info_lines() -> Iterator[None]:
    """Helm's chart loader logs `INFO found symbolic link in path` for each of the chart's links into
    deploy/ (three, every run) through Go's default logger, straight to file descriptor 2:
    helm_python's log switch does not reach it. Descriptor 2 goes to a file meanwhile; what is not
    such an INFO line (a warning, an error) is passed on to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines():
                if not GO_INFO_LINE.match(line):
                    print(line, file=sys.stderr)


def _rendered(values: dict[str, object], api_versions: Sequence[str] = ()) -> dict[str, str]:
    """template name (under templates/) -> the text the chart renders with `values`; `api_versions`
    are what `.Capabilities.APIVersions` holds besides Helm's defaults, as `helm template --api-versions`
    gives them."""
    with _without_go_info_lines():
        chart = helm_python.Chart.load(CHART)
    try:
        if api_versions:
            # Chart.render does not take them; the library's render call does (helm-c-sdk's render
            # options: name, namespace, api_versions, ... as JSON), and Helm puts them into
            # .Capabilities.APIVersions exactly as `helm template --api-versions` does.
            options = {"name": RELEASE, "namespace": NAMESPACE, "api_versions": list(api_versions)}
            rendered: dict[str, str] = json.loads(helm_native.call_string(
                "helm_render", chart._raw(), json.dumps(values), json.dumps(options)))
        else:
            rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    finally:
        chart.close()
    return {template.split("/templates/", 1)[1]: text for template, text in rendered.items()}


def render(values: dict[str, object] | None = None, *, api_versions: Sequence[str] = ()) -> dict[Path, str]:
    """The plain manifests the chart renders with `values` (default: PLAIN_VALUES, plus PLAIN_VARIANTS):
    path -> text."""
    rendered = _rendered(PLAIN_VALUES if values is None else values, api_versions)
    if values is None:
        for name, variant in PLAIN_VARIANTS.items():
            if not _has_objects(rendered.get(name, "")):
                rendered[name] = _rendered(merged(PLAIN_VALUES, variant))[name]
    files: dict[Path, str] = {}
    for name, text in sorted(rendered.items()):
        if not name.endswith(".yaml") or name.startswith("helm-"):
            continue
        if name == "policies.yaml":
            # split() with a group: [before, file1, text1, file2, text2, ...]
            parts = FILE_MARKER.split(text)
            for relative, section in zip(parts[1::2], parts[2::2], strict=True):
                files[DEPLOY / relative] = _tidy(section.rstrip().removesuffix("---"))
        elif _has_objects(text):
            files[DEPLOY / name] = HEADER.format(name=name) + _tidy(text)
    return files


def plain_manifests() -> list[Path]:
    """The YAML files of deploy/ that the chart renders (all but the chart's own)."""
    return sorted([*DEPLOY.glob("*.yaml"), *(DEPLOY / "policies").glob("*.yaml")])


FREE_MAPS = frozenset({"nodeSelector", "env", "labels", "issuerRef", "resources", "requests", "limits"})
"""Maps of values.yaml whose keys are the user's (a node label, an environment variable)."""


class ValuesError(Exception):
    """A --set or -f the renderer cannot use; str() is the one-line message with the fix."""


def _split(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` not escaped by a backslash (and not inside `{...}` for a comma)."""
    parts, current, depth, escaped = [], "", 0, False
    for char in text:
        if escaped:
            current += char if char == separator else "\\" + char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "{":
            depth += 1
            current += char
        elif char == "}":
            depth -= 1
            current += char
        elif char == separator and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _typed(text: str) -> object:
    """A --set value as Helm types it: true/false, null, an integer, `{a,b}` a list, else text."""
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    if re.fullmatch(r"-?[0-9]+", text) and not (len(text) > 1 and text.lstrip("-").startswith("0")):
        return int(text)
    if text.startswith("{") and text.endswith("}"):
        return [_typed(item) for item in _split(text[1:-1], ",") if item != ""]
    return text


def parse_set(text: str) -> list[tuple[list[str], object]]:
    """`a.b=1,c=x` -> [(["a", "b"], 1), (["c"], "x")]; raises ValuesError naming what is wrong."""
    out = []
    for assignment in _split(text, ","):
        if "=" not in assignment:
            raise ValuesError(f"--set {text!r}: {assignment!r} is not key=value; e.g. --set image.tag=0.1.0")
        key, value = assignment.split("=", 1)
        path = [part.replace("\\.", ".") for part in _split(key, ".")]
        if not all(path):
            raise ValuesError(f"--set {text!r}: {key!r} has an empty part; write keys as a.b.c")
        out.append((path, _typed(value)))
    return out


def merged(base: dict[str, object], over: dict[str, object]) -> dict[str, object]:
    """`over` merged into `base` as Helm merges values: maps key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _unknown(path: list[str], defaults: object) -> str | None:
    """Why `path` is no key of the chart's values (with the key probably meant), or None when it
    is one, or lies under a map the chart leaves to the user (nodeSelector, env, labels: empty or
    of free keys)."""
    here = defaults
    for depth, part in enumerate(path):
        if not isinstance(here, dict) or not here or (depth and path[depth - 1] in FREE_MAPS):
            return None
        if part not in here:
            close = difflib.get_close_matches(part, [str(k) for k in here], n=1)
            meant = f"; did you mean {'.'.join([*path[:depth], close[0]])}?" if close else ""
            return f"the chart's values.yaml has no {'.'.join(path[:depth + 1])}{meant}"
        here = here[part]
    return None


def user_values(files: list[str], sets: list[str]) -> dict[str, object]:
    """The values of -f files and --set, in that order, merged over PLAIN_VALUES; a key the chart
    does not know is told on stderr."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    values: dict[str, object] = dict(PLAIN_VALUES)
    for name in files:
        try:
            loaded = yaml.safe_load(Path(name).read_text()) or {}
        except OSError as err:
            raise ValuesError(f"-f {name}: cannot be read ({err.strerror})") from None
        except yaml.YAMLError as err:
            raise ValuesError(f"-f {name}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
        if not isinstance(loaded, dict):
            raise ValuesError(f"-f {name}: must be a map of values, as deploy/chart/values.yaml is")
        values = merged(values, loaded)
    for text in sets:
        for path, value in parse_set(text):
            nested: object = value
            for part in reversed(path):
                nested = {part: nested}
            assert isinstance(nested, dict)
            values = merged(values, nested)
    for path in _leaves(values):
        why = _unknown(path, defaults)
        if why:
            print(f"note: {'.'.join(path)}: {why} (Helm ignores it)", file=sys.stderr)
    return values


AUTO_SWITCHES = {("metrics", "serviceMonitor", "enabled"): "monitoring.coreos.com/v1/ServiceMonitor",
                 ("prometheusRule", "enabled"): "monitoring.coreos.com/v1/PrometheusRule"}
"""Values that may be `auto` (render only where the cluster serves the API), and that API."""


def _note_auto_switches(values: dict[str, object], api_versions: Sequence[str]) -> None:
    """Say on stderr which `auto` switch renders nothing for want of --api-versions (helm install
    asks the cluster; a renderer cannot)."""
    for path, api in AUTO_SWITCHES.items():
        value: object = values
        for part in path:
            value = value.get(part) if isinstance(value, dict) else None
        if value == "auto" and api not in api_versions:
            print(f"note: {'.'.join(path)}: auto renders nothing without --api-versions {api} (pass it when"
                  " your cluster runs the Prometheus Operator)", file=sys.stderr)


def _leaves(values: object, prefix: list[str] | None = None) -> list[list[str]]:
    prefix = prefix or []
    if not isinstance(values, dict) or not values:
        return [prefix] if prefix else []
    return [leaf for key, value in values.items() for leaf in _leaves(value, [*prefix, str(key)])]


def write_out(files: dict[Path, str], out: Path) -> None:
    """The rendered files and the chart's CRDs into `out` (deploy/'s layout, CRDs in crds/)."""
    for path, text in files.items():
        target = out / path.relative_to(DEPLOY)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    (out / "crds").mkdir(parents=True, exist_ok=True)
    for crd in sorted((CHART / "crds").glob("*.yaml")):
        (out / "crds" / crd.name).write_text(crd.read_text())
        print(f"wrote {out / 'crds' / crd.name}")


def build_parser() -> argparse.ArgumentParser:
    """The script's flags (tests/docs reads them: every flag the docs name must exist)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a file differs")
    parser.add_argument("-f", "--values", action="append", default=[], metavar="FILE",
                        help="a values file over the chart's defaults (repeatable, in order); needs --out")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a value over the files (repeatable; a.b=1,c=x; a\\.b for a dot in a key); needs --out")
    parser.add_argument("--out", metavar="DIR", help="write the manifests and CRDs into DIR instead of deploy/")
    parser.add_argument("-a", "--api-versions", action="append", default=[], metavar="GROUP/VERSION[/KIND]",
                        help="an API your cluster serves, for the chart's `auto` switches (repeatable or comma"
                        " separated, as helm template's): e.g. monitoring.coreos.com/v1/ServiceMonitor; needs --out")
    return parser


def main() -> int:
    """Rewrite deploy/ from the chart, or (--check) say which files differ; exit 1 then. With
    -f/--set/--out: render your values into --out; exit 2 for values it cannot use."""
    parser = build_parser()
    args = parser.parse_args()
    api_versions = [item.strip() for given in args.api_versions for item in given.split(",") if item.strip()]
    refusal = (
        "-f, --set and --api-versions need --out DIR: deploy/ holds the chart's defaults (tests check it)"
        if (args.values or args.set or api_versions) and not args.out
        else "--check compares deploy/ with the chart's defaults; it takes no --out" if args.out and args.check
        else None
    )
    if refusal:
        print(f"render-manifests.py: error: {refusal}", file=sys.stderr)
        return 2
    helm_python.disable_logging()  # its INFO lines about the chart's links into deploy/
    if args.out:
        try:
            values = user_values(args.values, args.set)
            _note_auto_switches(values, api_versions)
            files = render(values, api_versions=api_versions)
        except ValuesError as err:
            print(f"render-manifests.py: error: {err}", file=sys.stderr)
            return 2
        except Exception as err:  # Helm's own refusal (a template's `fail`, a wrong type): one line
            print(f"render-manifests.py: error: the chart does not render with these values: {err}",
                  file=sys.stderr)
            return 2
        write_out(files, Path(args.out))
        return 0
    files = render()
    stale = [path for path in plain_manifests() if path not in files]
    differ = [path for path, text in files.items()
              if not path.exists() or significant(path.read_text()) != significant(text)]  # fmt: skip
    for path in stale:
        print(f"{path.relative_to(ROOT)}: no template of the chart renders it", file=sys.stderr)
    if args.check:
        for path in differ:
            print(f"{path.relative_to(ROOT)}: differs from the chart; run scripts/render-manifests.py", file=sys.stderr)
        return 1 if differ or stale else 0
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
