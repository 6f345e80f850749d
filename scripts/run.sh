#!/usr/bin/env bash
# Installs elasticgpu into .venv and runs it. With no arguments it runs `elasticgpu demo`: a
# local API server (the cached build of testserver/; built once, a few minutes, when missing),
# the controller, the webhook and simulated node agents, a few claims, and what each container
# sees. `scripts/run.sh plan` plans the bundled sample offline; any arguments are passed to
# `elasticgpu` (e.g. `scripts/run.sh crds`, `scripts/run.sh sandbox up`).
# What it does before the command is told on stderr, one line a step; at the end, if
# `elasticgpu` is not on PATH, how to put it there (the README's next commands use it).
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "run.sh: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "first run: making a virtual environment in .venv (python3 -m venv), then installing elasticgpu into it"
  python3 -m venv .venv
fi
# An editable install follows the source by itself: reinstall only when pyproject.toml (dependencies,
# console scripts) changed since the last install, or the command is missing (it cost ~5 s a run).
stamp=.venv/.elasticgpu-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -x .venv/bin/elasticgpu ] || [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  say "installing elasticgpu and its dependencies into .venv (pip; about 40 s the first time, once; log: .venv/pip.log)"
  # pip's own lines, one per package, as progress; the whole log is kept for a failure.
  if ! .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off -e . 2>&1 \
      | tee .venv/pip.log \
      | awk '/^(Collecting|Successfully installed)/ { if ($1 == "Collecting") { n++; printf "run.sh:   %d %s\n", n, $2 } else print "run.sh: installed " (NF - 2) " package" (NF == 3 ? "" : "s"); fflush() }' >&2; then
    say "pip failed; the end of .venv/pip.log:"
    tail -n 20 .venv/pip.log >&2
    exit 1
  fi
  echo "$wanted" > "$stamp"
fi
if [ "$#" -eq 0 ]; then
  set -- demo
fi
if [ "$(command -v elasticgpu 2>/dev/null)" != "$PWD/.venv/bin/elasticgpu" ]; then
  # Said last, by elasticgpu itself as it exits (cli.main): exec keeps Ctrl-C and SIGTERM going straight to it.
  export ELASTICGPU_EXIT_NOTE="run.sh: elasticgpu and kubectl-egpu are in $PWD/.venv/bin, not on your PATH; for the README's next commands:
run.sh:   export PATH=\"$PWD/.venv/bin:\$PATH\"     (this shell)   or   bash scripts/run.sh ARGS...   (any shell)"
fi
exec .venv/bin/elasticgpu "$@"
