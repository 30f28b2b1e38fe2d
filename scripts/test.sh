#!/usr/bin/env bash
# The whole suite (make test), in two phases side by side on one machine:
#   2. the vLLM and Docker tests, in one process: they share one vLLM server per session and
#      each boot takes most of both cores, so two of them side by side would only slow each
#      other (measured on a 2-core machine, 2026-12-03: two workers, the shared server's tests
#      on one of them, took 44 min against 33.5 serial, and 9 tests timed out or raced);
#   1. beside it, the tests that need neither, on two workers (pytest-xdist, one module per
#      worker at a time: module fixtures and order are kept), at a lower priority (nice): phase
#      2 leaves about a third of two cores idle (waiting for boots, agents, containers; 1.27
#      cores busy on average, sampled 2026-12-03), which phase 1 takes without delaying it.
# Phase 2's output comes as it runs, phase 1's (kept in .scratch/test-logs/) after it. Both
# phases always run to the end; the first nonzero exit wins (pytest's 5, "no tests",
# included). Extra arguments go to both pytest invocations. SERIAL=1 runs phase 1 first, then
# phase 2, as before (slower; for a machine where the two would disturb each other).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
LOGS=.scratch/test-logs
mkdir -p "$LOGS"
phase1=("$PY" -m pytest -m "not vllm and not docker" -n 2 --dist loadfile "$@")
phase2=("$PY" -m pytest -m "vllm or docker" "$@")

if [ "${SERIAL:-0}" = 1 ]; then
  rc=0
  "${phase1[@]}" || rc=$?
  "${phase2[@]}" || { r=$?; [ "$rc" -eq 0 ] && rc=$r; }
  exit "$rc"
fi

t0=$SECONDS
log1=$(mktemp "$LOGS/phase1-XXXXXX.log")  # one per run: a test runs this script, too
nice -n 10 "${phase1[@]}" > "$log1" 2>&1 &
p1=$!
trap 'kill -TERM "$p1" 2>/dev/null; wait "$p1" 2>/dev/null' INT TERM
echo "phase 1 (no vLLM, no Docker) runs beside phase 2, niced; its output follows phase 2's"
rc2=0
"${phase2[@]}" || rc2=$?
echo "phase 2 ended after $((SECONDS - t0)) s (exit $rc2); waiting for phase 1"
rc1=0
wait "$p1" || rc1=$?
trap - INT TERM
echo "================================ phase 1 ================================"
cat "$log1"
echo "phase 1 exit $rc1; both phases took $((SECONDS - t0)) s"
[ "$rc1" -ne 0 ] && exit "$rc1"
exit "$rc2"
