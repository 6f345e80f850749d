"""What docs/*.md claim about settings and watches holds in the code
(issue 23, item 9: docs/quota.md said quotas were not watched long after they were).

Read from the code itself, as `collect.reasons()` reads the reasons, so that a setting's default
changed or a kind watched or no longer watched fails here until the guides say so (the flags,
chart values, hooks and environment variables the docs name: test_named_things.py):

- every `` `SomeSettings.field` `` names a field of a settings dataclass, and where the docs give
  its default (`` `QuotaSettings.recheck_s` (2 s) ``) that is the default;
- "the controller watches X" / "does not watch X" / "X are polled" agree with the kinds the
  controller's watch engines watch (`informer.KINDS`, kopf's `operator.WATCHED`).
"""

from __future__ import annotations

import dataclasses
import importlib
import re

from elasticgpu.controller.flow.machinery import informer
from tests.docs import collect

DOCS = sorted((collect.ROOT / "docs").glob("*.md"))
SETTINGS_MODULES = ("elasticgpu.controller.settings", "elasticgpu.agent.settings",
                    "elasticgpu.controller.admission.settings", "elasticgpu.controller.edge.leader")

KIND_WORDS = {"claims": "claim", "elasticgpus": "egpu", "gpus": "gpu", "classes": "class", "pods": "pod",
              "nodes": "node", "namespaces": "namespace", "quotas": "quota", "elasticgpuquotas": "quota"}
"""How the guides name each kind the controller can watch (as `informer.KINDS` spells it)."""


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
