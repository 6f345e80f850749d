"""Every flag, Helm hook, chart value and ELASTICGPU_* variable that README.md, docs/*.md and the
chart's values.yaml name exists in the code (issue 29: the README said a flag that exists was
"not there yet", values.yaml named a deprecated flag and a hook the chart does not have)."""

from __future__ import annotations

from pathlib import Path

from tests.docs import named


def test_every_flag_the_docs_name_exists() -> None:
    ours = named.our_flags()
    found = named.named_flags()
    # The reader must keep finding flags of each kind of owner.
    assert {"--cri-listen", "--kubeconfig"} <= {n.flag for n in found if n.owner == ""}
    assert any(n.owner and n.owner.endswith(".py") for n in found)
    missing = []
    for item in found:
        if item.owner is None:
            continue
        if item.owner == "":
            if item.flag not in ours and item.flag not in named.FOREIGN:
                missing.append(f"{item.where}: {item.flag} (no such flag of elasticgpu, kubectl egpu or"
                               " render-manifests.py; if another program's, add it to FOREIGN)")
        else:
            source = named.ROOT / item.owner
            if not source.is_file() or item.flag not in source.read_text():
                missing.append(f"{item.where}: {item.flag} (not in {item.owner})")
    assert not missing, "flags the docs name that do not exist:\n" + "\n".join(missing)


def test_every_helm_hook_the_docs_name_is_the_charts() -> None:
    hooks = named.chart_hooks()
    assert "post-delete" in hooks
    wrong = [f"{where}: {hook} (the chart's hooks: {sorted(hooks)})" for hook, where in named.named_hooks()
             if hook not in hooks]
    assert not wrong, wrong


def test_every_chart_value_the_docs_name_exists() -> None:
    found = named.named_values()
    assert any(key == "image.repository" for key, _ in found)
    wrong = [f"{where}: {key}" for key, where in found if not named.has_value(key)]
    assert not wrong, "values the docs name that deploy/chart/values.yaml does not have: " + ", ".join(wrong)


def test_every_environment_variable_the_docs_name_exists() -> None:
    known = named.known_environment()
    assert "ELASTICGPU_AGENT_CRI_UPSTREAM" in known and "ELASTICGPU_HEARTBEAT_GRACE_S" in known
    wrong = [f"{where}: {name}" for name, where in named.named_environment() if name not in known]
    assert not wrong, "ELASTICGPU_* variables the docs name that no code uses: " + ", ".join(wrong)


def test_the_reader_tells_owners_apart(tmp_path: Path) -> None:
    """The reader itself: a kubectl flag is kubectl's, a bench flag its script's, a bare one ours."""
    line = ("    kubectl apply --server-side -f crds/ && python bench/openb.py --seeds 5  # `--cri-listen`, also"
            " --metrics-port")
    owners = {n.flag: n.owner for n in named._from_code(line.strip(), "x")}
    assert owners == {"--server-side": None, "--seeds": "bench/openb.py", "--cri-listen": "", "--metrics-port": ""}


def test_a_deprecated_flag_is_named_only_as_deprecated() -> None:
    deprecated = named.deprecated_flags()
    assert {"--metrics-port", "--health-port"} <= deprecated
    wrong = [f"{where}: {flag}" for flag, where, line in named.lines_naming(deprecated)
             if not any(word in line.lower() for word in ("deprecated", "older", "still work"))]
    assert not wrong, "deprecated flags named as if current (name the new flag, or say deprecated): " + ", ".join(wrong)


def test_no_flag_that_exists_is_called_missing() -> None:
    wrong = [f"{where}: {flag}" for flag, where, line in named.lines_naming(named.our_flags())
             if any(word in line.lower() for word in ("not there yet", "not yet implemented", "coming soon"))]
    assert not wrong, "the docs call these flags missing, but they exist: " + ", ".join(wrong)
