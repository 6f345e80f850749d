#!/usr/bin/env bash
# Installs elasticgpu into .venv and runs it. With no arguments it runs `elasticgpu demo`: a
# local API server (the cached build of testserver/; built once, a few minutes, when missing),
# the controller, the webhook and simulated node agents, a few claims, and what each container
# sees. `scripts/run.sh plan` plans the bundled sample offline; any arguments are passed to
# `elasticgpu` (e.g. `scripts/run.sh crds`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# An editable install follows the source by itself: reinstall only when pyproject.toml (dependencies,
# console scripts) changed since the last install, or the command is missing (it cost ~5 s a run).
stamp=.venv/.elasticgpu-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/elasticgpu ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
  echo "$wanted" > "$stamp"
fi
if [ "$#" -eq 0 ]; then
  set -- demo
fi
exec .venv/bin/elasticgpu "$@"
