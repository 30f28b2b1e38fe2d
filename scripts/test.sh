#!/usr/bin/env bash
# The whole suite (make test), in two phases on one machine:
#   1. the tests that need neither a vLLM server nor Docker, on two workers (pytest-xdist,
#      one module per worker at a time: module fixtures and order are kept);
#   2. the vLLM and Docker tests, in one process: they share one vLLM server per session and
#      each boot takes both cores, so running them side by side would only slow each other
#      (measured on a 2-core machine, 2026-12-03: two workers, the shared server's tests on one
#      of them, took 44 min against 33.5 serial, and 9 tests timed out or raced; and phase 1
#      niced beside phase 2, tried 2026-12-03 at 2ff305c: phase 1 took 36.6 min instead of
#      16.6, and 4 of its tests and 5 container tests failed on timing: keep them apart).
#      A module's own server boots beside the next such module's (tests/boot_ahead.py): two
#      boots take about 1.25 times one, and no test runs beside a boot.
# The container tests' images (scripts/images.sh: 150-215 s from nothing, most of it downloads,
# unpacking and `docker import`, not two busy cores) are built beside phase 1 when the whole
# suite runs (no arguments) and a Docker engine answers, under the lock the tests' own
# `docker_images` fixture takes: phase 2 then finds them built (one cached pass, ~14 s). Its
# log is .scratch/images-beside-phase-1.log; a build that failed there fails the container
# tests with the fixture's own run of it, which says why.
# Both phases always run; the first nonzero exit wins (pytest's 5, "no tests", included).
# Extra arguments go to both pytest invocations.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
rc=0
images=
if [ $# -eq 0 ] && docker info >/dev/null 2>&1; then
  mkdir -p .scratch .cache
  log=.scratch/images-beside-phase-1.log
  flock .cache/docker-images.lock scripts/images.sh >"$log" 2>&1 &
  images=$!
  echo "test.sh: building the container images beside phase 1 (pid $images, log $log)"
fi
"$PY" -m pytest -m "not vllm and not docker" -n 2 --dist loadfile "$@" || rc=$?
if [ -n "$images" ]; then
  wait "$images" && echo "test.sh: images built beside phase 1" ||
    echo "test.sh: the image build beside phase 1 failed ($log); the container tests retry it"
fi
"$PY" -m pytest -m "vllm or docker" "$@" || { r=$?; [ "$rc" -eq 0 ] && rc=$r; }
exit "$rc"
