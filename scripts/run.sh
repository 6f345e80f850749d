#!/usr/bin/env bash
# Installs elasticgpu into .venv and runs it. With no arguments it runs `elasticgpu plan` on the
# bundled sample cluster and claims, which needs no Kubernetes cluster; any arguments are passed
# to `elasticgpu` instead (e.g. `scripts/run.sh crds`).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e .
if [ "$#" -eq 0 ]; then
  set -- plan
fi
exec .venv/bin/elasticgpu "$@"
