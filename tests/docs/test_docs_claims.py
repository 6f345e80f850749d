"""What docs/*.md claim about flags, settings, environment variables and watches holds in the code
(issue 23, item 9: docs/quota.md said quotas were not watched long after they were).

Read from the code itself, as `collect.reasons()` reads the reasons, so that a flag renamed, a
setting's default changed or a kind watched or no longer watched fails here until the guides say so:

- every `--flag` is one the code's parsers take (`elasticgpu ...`, `kubectl egpu ...`, the
  agent's settings), or one of a `bench/` script named on its line, or a flag of another tool
  (`OTHER_TOOLS`) that its line names;
- every `` `SomeSettings.field` `` names a field of a settings dataclass, and where the docs give
  its default (`` `QuotaSettings.recheck_s` (2 s) ``) that is the default;
- every `ELASTICGPU_*` environment variable is one the code reads or writes;
- "the controller watches X" / "does not watch X" / "X are polled" agree with the kinds the
  controller's watch engines watch (`informer.KINDS`, kopf's `operator.WATCHED`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import re

from elasticgpu import cli
from elasticgpu.agent import settings as agent_settings
from elasticgpu.controller.flow import informer
from elasticgpu.kubectl_plugin import command
from tests.docs import collect

DOCS = sorted((collect.ROOT / "docs").glob("*.md"))
FLAG = re.compile(r"(?<![\w/-])--[a-z][a-z0-9-]*")

OTHER_TOOLS = {
    "--create-namespace": "helm", "--set": "helm",
    "--container-runtime-endpoint": "kubelet",
    "--server-side": "kubectl", "--overwrite": "kubectl", "--cascade": "kubectl",
}
"""Flags of other programs that the guides show, and the program whose command line they are on."""

SETTINGS_MODULES = ("elasticgpu.controller.settings", "elasticgpu.agent.settings",
                    "elasticgpu.controller.admission.settings", "elasticgpu.controller.edge.leader")

KIND_WORDS = {"claims": "claim", "elasticgpus": "egpu", "gpus": "gpu", "classes": "class", "pods": "pod",
              "nodes": "node", "namespaces": "namespace", "quotas": "quota", "elasticgpuquotas": "quota"}
"""How the guides name each kind the controller can watch (as `informer.KINDS` spells it)."""


def _parser_flags(parser: argparse.ArgumentParser, out: set[str]) -> set[str]:
    for action in parser._actions:  # argparse keeps its actions there
        out.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _parser_flags(sub, out)
    return out


def code_flags() -> set[str]:
    """Every long flag of the commands this project ships (the agent's included: `elasticgpu agent`)."""
    flags = _parser_flags(cli.build_parser(), set()) | _parser_flags(command.build_parser(), set())
    agent = argparse.ArgumentParser()
    agent_settings.add_arguments(agent)
    return flags | _parser_flags(agent, set())


def bench_flags() -> set[str]:
    """The flags the `bench/` scripts' parsers take (literal `add_argument("--x", ...)`)."""
    found: set[str] = set()
    for path in sorted((collect.ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                found.update(a.value for a in node.args
                             if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"))
    return found


def _lines() -> list[tuple[str, int, str, str]]:
    """(page, line number, the line, the line with the one before it: a command's context)."""
    out = []
    for page in DOCS:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines, 1):
            out.append((page.name, number, line, (lines[number - 2] if number > 1 else "") + "\n" + line))
    return out


def test_every_flag_the_docs_name_is_taken_by_its_program() -> None:
    ours, bench = code_flags(), bench_flags()
    assert {"--leader-elect", "--metrics-bind-address", "--force", "--cri-listen"} <= ours  # the collector works
    wrong = []
    for page, number, line, context in _lines():
        for flag in FLAG.findall(line):
            tool = OTHER_TOOLS.get(flag)
            if flag in ours or (flag in bench and "bench/" in line):
                continue
            if tool is not None and re.search(rf"\b{tool}\b", context):
                continue
            wrong.append(f"docs/{page}:{number}: {flag}" + (f" (a {tool} flag, but its line names no {tool})"
                                                             if tool else ""))
    assert not wrong, ("flags the docs name that no parser of the code takes (rename them in the docs, or add"
                       f" another program's flag to OTHER_TOOLS): {wrong}")


def _settings_classes() -> dict[str, type]:
    classes: dict[str, type] = {}
    for name in SETTINGS_MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if attr.endswith("Settings") and dataclasses.is_dataclass(value) and isinstance(value, type):
                classes[attr] = value
    return classes


SETTING = re.compile(r"`(\w+Settings)\.(\w+)`(?:\s*\((\d+(?:\.\d+)?)\s*s?\))?")


def test_every_setting_the_docs_name_exists_with_the_default_they_give() -> None:
    classes = _settings_classes()
    assert {"QuotaSettings", "ResyncSettings", "AgentSettings"} <= set(classes)
    wrong, seen = [], 0
    for page in DOCS:
        text = " ".join(page.read_text().split())  # a claim may wrap across lines
        for cls_name, field_name, said in SETTING.findall(text):
            seen += 1
            cls = classes.get(cls_name)
            fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
            if field_name not in fields:
                wrong.append(f"docs/{page.name}: {cls_name}.{field_name} does not exist")
            elif said and float(said) != fields[field_name].default:
                wrong.append(f"docs/{page.name}: {cls_name}.{field_name} is said to be {said}, its default is"
                             f" {fields[field_name].default}")
    assert seen, "no setting found in the docs: the pattern no longer matches how they name settings"
    assert not wrong, wrong


def test_every_environment_variable_the_docs_name_is_one_the_code_uses() -> None:
    source = "\n".join(path.read_text() for path in sorted((collect.ROOT / "elasticgpu").rglob("*.py")))
    agent = {"ELASTICGPU_AGENT_" + f.name.upper() for cls in agent_settings._CONCERNS.values()
             for f in dataclasses.fields(cls)}
    wrong = []
    for page, number, line, _context in _lines():
        for name in re.findall(r"\bELASTICGPU_[A-Z0-9_]*[A-Z0-9]\b", line):
            if name not in agent and not re.search(rf"\b{name}\b", source):
                wrong.append(f"docs/{page}:{number}: {name}")
    assert not wrong, f"environment variables the docs name that the code never reads: {wrong}"


WATCHES = re.compile(r"\bcontroller (does not|doesn't|never|no longer)?\s*watch(?:es)? (\w+)", re.IGNORECASE)
POLLED = re.compile(r"\b(\w+) (?:are|is) (?:polled|not watched)\b", re.IGNORECASE)


def watched_kinds() -> set[str]:
    """The kinds the controller watches: both watch engines must agree."""
    from elasticgpu.controller.process import operator

    kopf = {entry[0] for entry in operator.WATCHED}
    assert kopf == set(informer.KINDS), f"the two watch engines watch different kinds: {kopf} vs {informer.KINDS}"
    return set(informer.KINDS)


def test_what_the_docs_say_the_controller_watches_is_what_it_watches() -> None:
    watched = watched_kinds()
    wrong, seen = [], 0
    for page in DOCS:
        text = " ".join(page.read_text().split())
        for negation, word in WATCHES.findall(text):
            kind = KIND_WORDS.get(word.lower())
            if kind is None:
                continue
            seen += 1
            if bool(negation) == (kind in watched):
                wrong.append(f"docs/{page.name}: 'controller {negation + ' ' if negation else ''}watch... {word}'"
                             f" but the controller {'watches' if kind in watched else 'does not watch'} {word}")
        for word in POLLED.findall(text):
            kind = KIND_WORDS.get(word.lower())
            if kind is not None and kind in watched:
                seen += 1
                wrong.append(f"docs/{page.name}: '{word} are polled' but the controller watches {word}")
    assert seen, "no statement about watches found: the patterns no longer match the docs"
    assert not wrong, wrong
