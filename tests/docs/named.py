"""What the docs name, and what the code has, for tests/docs/test_named_things.py.

The docs are README.md, every docs/*.md (a guide added later is read too) and the chart's
values.yaml (its comments). A flag is read with the command it belongs to: in a code span or a
code line, the command at the start of its segment (`kubectl apply --server-side` is kubectl's,
`python bench/openb.py --seeds` that script's, `elasticgpu agent run --cri-listen` ours); a flag
with no command before it is ours, unless FOREIGN names whose it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "chart" / "values.yaml"


def pages() -> list[Path]:
    """The documents whose claims are checked."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), VALUES]


FOREIGN = {
    "--container-runtime-endpoint": "kubelet",
    "--service-account-max-token-expiration": "kube-apiserver",
    "--pdeathsig": "setpriv (util-linux)",
    "--create-namespace": "helm install",
    "--server-side": "kubectl apply",
    "--max-node-provision-time": "cluster-autoscaler",
    "--wait": "helm upgrade",
    "--bound-object-kind": "kubectl create token",
    "--overwrite": "kubectl annotate",
    "--now": "systemctl enable",
    "--raw": "kubectl config view",
    "--type": "kubectl patch",
    "--api-versions": "helm template",
    "--driver": "minikube start",
}
"""Flags the docs name bare (in prose) that belong to another program, and whose."""

OURS = ("elasticgpu", "kubectl egpu", "kubectl-egpu", "python -m elasticgpu", "bash scripts/run.sh", "scripts/run.sh")
FOREIGN_COMMANDS = (
    "kubectl", "helm", "podman", "docker", "pip", "python3 -m venv", "systemctl", "nvidia-smi", "apt-get",
    "journalctl", "setpriv", "ctr", "git", "curl", "cp", "nvidia-ctk", "unshare",
)
SCRIPT = re.compile(r"^(?:\.venv/bin/)?(?:python3?|bash)\s+(\S+\.(?:py|sh))\b")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")
SPAN = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Named:
    """A flag as a document names it: `owner` is ours (""), a file of the repository whose source
    must hold it (its path), or another program (None: not checked)."""

    flag: str
    owner: str | None
    where: str


def _owner(segment: str) -> str | None:
    """Whose flags follow at the start of a command `segment`: "" ours, a path, None another's."""
    text = segment.strip().removeprefix("$ ").removeprefix("sudo ")
    script = SCRIPT.match(text)
    if script and not script.group(1).startswith("scripts/run.sh"):
        return script.group(1)
    if text.startswith(OURS) or text.startswith("-"):
        return ""
    if any(text == c or text.startswith(c + " ") for c in FOREIGN_COMMANDS):
        return None
    first = text.split(" ", 1)[0]
    return first if first.startswith(("deploy/", "scripts/", "testserver/", "testruntime/")) else ""


def _from_code(code: str, where: str) -> Iterator[Named]:
    """Flags of one code line: split at `&&`, `;`, `|`; each segment's command owns its flags;
    a `# comment` is prose."""
    code, _, comment = code.partition(" #")
    for segment in re.split(r"&&|;|\|", code):
        owner = _owner(segment)
        for flag in FLAG.findall(segment):
            yield Named(flag, owner, where)
    yield from _from_prose(comment, where)


def _from_prose(text: str, where: str) -> Iterator[Named]:
    for span in SPAN.findall(text):
        yield from _from_code(span, where)
    for flag in FLAG.findall(SPAN.sub(" ", text)):
        yield Named(flag, "", where)


def named_flags() -> list[Named]:
    """Every flag the pages name, with its owner."""
    out: list[Named] = []
    for page in pages():
        lines = page.read_text().splitlines()
        fenced = False
        pending = ""
        for number, line in enumerate(lines, start=1):
            where = f"{page.relative_to(ROOT)}:{number}"
            if page.suffix == ".yaml":
                comment = line.partition("#")[2] if "#" in line else ""
                code = comment.strip()
                # values.yaml's comments quote commands as indented lines (`#   helm install ...`).
                if comment.startswith("   ") and not SPAN.search(code):
                    out.extend(_from_code(code, where))
                else:
                    out.extend(_from_prose(comment, where))
                continue
            if line.strip().startswith("```"):
                fenced = not fenced
                continue
            if fenced or line.startswith("    ") or pending:
                code = pending + line.strip()
                if code.endswith("\\"):
                    pending = code[:-1] + " "
                    continue
                pending = ""
                out.extend(_from_code(code, where))
            else:
                out.extend(_from_prose(line, where))
    return out


def _parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _parser_flags(sub)
    return found


def _script_module(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def our_flags() -> set[str]:
    """Every flag of `elasticgpu`, `kubectl egpu` and scripts/render-manifests.py, from their parsers."""
    from elasticgpu import cli
    from elasticgpu.kubectl_plugin import command

    render = _script_module(ROOT / "scripts" / "render-manifests.py")
    return (_parser_flags(cli.build_parser()) | _parser_flags(command.build_parser())
            | _parser_flags(render.build_parser()))  # type: ignore[attr-defined]


HOOK = re.compile(r"\b((?:pre|post)-(?:install|delete|upgrade|rollback))\b")


def named_hooks() -> list[tuple[str, str]]:
    """(Helm hook, where) for every hook the pages name."""
    return [
        (hook, f"{page.relative_to(ROOT)}:{number}")
        for page in pages()
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        for hook in HOOK.findall(line)
    ]


def chart_hooks() -> set[str]:
    """The `helm.sh/hook` values of the chart's templates."""
    found: set[str] = set()
    for template in (ROOT / "deploy" / "chart" / "templates").glob("*.yaml"):
        for match in re.finditer(r"helm\.sh/hook:\s*\"?([a-z,-]+)", template.read_text()):
            found.update(match.group(1).split(","))
    return found


VALUE_KEY = re.compile(r"`((?:namespace|image|controller|webhook|agent|metrics|defaultClass)\.[A-Za-z0-9_.*]+)")


def named_values() -> list[tuple[str, str]]:
    """(values path, where) for every `image.tag`-like key the pages name in backticks."""
    out = []
    for page in pages():
        for number, line in enumerate(page.read_text().splitlines(), start=1):
            for key in VALUE_KEY.findall(line):
                if not key.endswith((".yaml", ".md", ".py", ".")):
                    out.append((key, f"{page.relative_to(ROOT)}:{number}"))
    return out


def has_value(key: str) -> bool:
    """True when values.yaml has `key` (`a.b.c`; `a.*` any key under a)."""
    here: object = yaml.safe_load(VALUES.read_text())
    for part in key.split("."):
        if part == "*":
            return isinstance(here, dict) and bool(here)
        if not isinstance(here, dict) or part not in here:
            return False
        here = here[part]
    return True


ENV = re.compile(r"\b(ELASTICGPU_[A-Z0-9_]*[A-Z0-9])\b")


def named_environment() -> list[tuple[str, str]]:
    """(variable, where) for every ELASTICGPU_* variable the pages name."""
    return [
        (name, f"{page.relative_to(ROOT)}:{number}")
        for page in pages()
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        for name in ENV.findall(line)
    ]


def known_environment() -> set[str]:
    """ELASTICGPU_* names the code reads or writes: spelt out in its source (elasticgpu/, scripts/,
    deploy/, tests/), or an agent setting's variable (ELASTICGPU_AGENT_<FIELD>)."""
    import dataclasses

    from elasticgpu.agent import settings

    found: set[str] = set()
    for folder in ("elasticgpu", "scripts", "deploy", "tests", "testserver", "testruntime", "image"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".service", ".yaml", ".tpl") and path.is_file():
                found.update(ENV.findall(path.read_text(errors="replace")))
    for concern in dataclasses.fields(settings.AgentSettings):
        factory = concern.default_factory
        if callable(factory) and dataclasses.is_dataclass(factory):
            found.update(f"ELASTICGPU_AGENT_{f.name.upper()}" for f in dataclasses.fields(factory))
    return found


def _parser_deprecated(parser: argparse.ArgumentParser) -> set[str]:
    found: set[str] = set()
    for action in parser._actions:
        text = (action.help or "").lower()
        # "Deprecated, use ...", or "the same server's port, older spelling": said first, not a
        # newer flag's help that mentions the older one.
        if re.match(r"deprecated|[^.(]*\bolder spelling\b", text):
            found.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _parser_deprecated(sub)
    return found


def deprecated_flags() -> set[str]:
    """Our flags whose help says they are deprecated (or an older spelling)."""
    from elasticgpu import cli

    return _parser_deprecated(cli.build_parser())


def lines_naming(flags: set[str]) -> list[tuple[str, str, str]]:
    """(flag, where, the line) for every line of the pages that names one of `flags`."""
    return [
        (flag, f"{page.relative_to(ROOT)}:{number}", line)
        for page in pages()
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        for flag in set(FLAG.findall(line)) & flags
    ]
