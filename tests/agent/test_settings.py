"""Agent settings: flag beats environment beats default; a bad value names the setting."""

from __future__ import annotations

import argparse

import pytest

from elasticgpu.agent import settings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults() -> None:
    built = settings.from_sources(parse(), environ={})
    assert built == settings.AgentSettings()
    assert built.inventory.heartbeat_interval_s == 30.0 and built.ledger.ledger_url.startswith("sqlite:////")


def test_flag_beats_environment_beats_default() -> None:
    environ = {"ELASTICGPU_AGENT_HEARTBEAT_INTERVAL_S": "12", "ELASTICGPU_AGENT_METRICS_PORT": "9999",
               "NODE_NAME": "from-downward-api"}
    built = settings.from_sources(parse("--metrics-port", "0", "--backend", "simulated"), environ=environ)
    assert built.inventory.heartbeat_interval_s == 12.0
    assert built.metrics.metrics_port == 0 and built.discovery.backend == "simulated"
    assert built.kube.node_name == "from-downward-api"
    assert settings.from_sources(parse("--node-name", "flag"), environ=environ).kube.node_name == "flag"


def test_a_bad_value_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"ELASTICGPU_AGENT_METRICS_PORT / --metrics-port='x': must be an integer"):
        settings.from_sources(parse(), environ={"ELASTICGPU_AGENT_METRICS_PORT": "x"})


def test_help_says_what_each_setting_does() -> None:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    text = parser.format_help()
    assert "Seconds between heartbeats of a GPU object" in text and "ELASTICGPU_AGENT_HEARTBEAT_INTERVAL_S" in text
    documented = {name for cls in (settings.InventorySettings, settings.UsageSettings, settings.LedgerSettings)
                  for name in settings.field_docs(cls)}
    assert {"heartbeat_interval_s", "usage_write_interval_s", "ledger_url"} <= documented


def test_cri_settings_and_the_switch_to_run_without_the_proxy() -> None:
    built = settings.from_sources(parse("--cri-listen", "/run/e/cri.sock", "--cdi-form", "both"),
                                  environ={"ELASTICGPU_AGENT_CRI_PROXY": "false",
                                           "ELASTICGPU_AGENT_CRI_UPSTREAM": "/var/run/crio/crio.sock"})
    assert (built.cri.cri_proxy, built.cri.cri_listen, built.cri.cri_upstream, built.cri.cdi_form) == (
        False, "/run/e/cri.sock", "/var/run/crio/crio.sock", "both")
    assert settings.from_sources(parse(), environ={}).cri.cri_proxy is True  # on unless switched off
    assert settings.from_sources(parse(), environ={}).cri.cdi_dir == "/var/run/cdi"
    with pytest.raises(ValueError, match=r"--cri-proxy='flase': must be true or false"):
        settings.from_sources(parse("--cri-proxy", "flase"), environ={})


def test_a_cdi_form_that_does_not_exist_is_refused_with_the_choices() -> None:
    from elasticgpu.agent import errors, running

    with pytest.raises(errors.AgentError, match=r"--cdi-form / ELASTICGPU_AGENT_CDI_FORM='fields' is not a CDI "
                       r"request form; use one of field, annotation, both"):
        running.hook_settings(settings.CriSettings(cdi_form="fields"))
    # Without the nginx front (`auto` would pick it where nginx is on PATH) the proxy is on kubelet's socket.
    alone = settings.CriSettings(cdi_form="annotation", cri_listen="/run/e.sock", cri_front="none")
    hook = running.hook_settings(alone)
    assert hook.injection.cdi_form.value == "annotation" and str(hook.proxy.listen) == "/run/e.sock"
