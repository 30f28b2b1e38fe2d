#!/usr/bin/env bash
# The whole suite (make test), in two phases that run side by side on one machine:
#   1. the tests that need neither a vLLM server nor Docker, on one pytest-xdist worker
#      (one module at a time: module fixtures and order are kept);
#   2. the vLLM and Docker tests, in one process: they share one vLLM server per session and
#      each boot takes most of a core for a minute.
# Measured on 2 cores: phase 2 alone keeps them 69 % busy (boots are chains of single-threaded
# imports; tests wait on agents, verifiers and containers), so phase 1 fills the rest instead of
# queueing behind it (run one after the other they took 17.7 + 33.5 minutes).
# Phase 2's output goes to .scratch/phase2.log and is printed when it ends. Both phases always
# run; the first nonzero exit wins (pytest's 5, "no tests", included). Extra arguments go to
# both pytest invocations. PHASES=serial runs them one after the other (phase 1 on 2 workers).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
rc1=0 rc2=0
if [ "${PHASES:-parallel}" = serial ]; then
  "$PY" -m pytest -m "not vllm and not docker" -n 2 --dist loadfile "$@" || rc1=$?
  "$PY" -m pytest -m "vllm or docker" "$@" || rc2=$?
else
  mkdir -p .scratch
  log=.scratch/phase2.log
  echo "phase 2 (vLLM and Docker tests) runs beside phase 1; its output: $log"
  "$PY" -m pytest -m "vllm or docker" "$@" > "$log" 2>&1 &
  p2=$!
  # Stopped from outside (CI's limit, ^C): stop phase 2 too and show what it printed.
  trap 'kill "$p2" 2>/dev/null; wait "$p2" 2>/dev/null; echo "== phase 2 =="; cat "$log"; exit 130' INT TERM
  "$PY" -m pytest -m "not vllm and not docker" -n 1 --dist loadfile "$@" || rc1=$?
  wait "$p2" || rc2=$?
  trap - INT TERM
  echo "== phase 2 (vLLM and Docker tests): exit $rc2 =="
  cat "$log"
fi
[ "$rc1" -ne 0 ] && exit "$rc1"
exit "$rc2"
