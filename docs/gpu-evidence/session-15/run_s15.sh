#!/bin/bash
# Session 15, calls 2 and 3 (after `bash .gpu/vllm/stage.sh` on the same machine): the probe's
# tokens/s cost at batch 256 with bench/gpu/tokens_ab_gpu.py's sandwich design, the speed
# reference and the step timer (BENCHMARKS.md, "H200, batch 256 with the sandwich design").
#
#   bash docs/gpu-evidence/session-15/run_s15.sh decode   # 32-token prompts, vLLM's default batching
#   bash docs/gpu-evidence/session-15/run_s15.sh mixed    # 128-token prompts, 512-token chunks
#
# The project's wheels in .gpu/call2/project: prepare.sh's (servewitness) and the probe's, built
# beside it with `python3 -m pip wheel --no-deps -w .gpu/call2/project ./probe` (prepare.sh
# builds only the root project). Writes under $OUT: host-SHAPE.txt (CPU, GPU, kernel),
# procstat-SHAPE.log (/proc/stat's cpu line every second: steal and the rest, for the speed
# regimes), call-SHAPE.log, and the bench's tokens_ab.jsonl and rounds.jsonl.
set -u
shape=${1:?decode or mixed}
export HOME=${HOME:-/root}
{ date -u; uname -a; nproc; lscpu; nvidia-smi; head -1 /proc/stat; } > "$OUT/host-$shape.txt" 2>&1
(while sleep 1; do echo "$(date +%s.%N) $(head -1 /proc/stat)"; done) > "$OUT/procstat-$shape.log" 2>&1 &
sampler=$!
export DESIGN=sandwich ARMS="A2 B C" REF_TURNS=2000 ROUNDS=100000 WARM=2 CONTROL=1.0
export BUDGET_S=${BUDGET_S:-420}
if [ "$shape" = mixed ]; then  # as session 9's mixed256 run: hooks declared, chunked prefill
  export MAX_BATCHED_TOKENS=512 PROMPT_LEN=128 MAX_TOKENS=64 HOOKS=1
else  # as the first batch-256 run (tokens_ab.jsonl, v2-graphs): no hooks, one prefill step
  export PROMPT_LEN=32 MAX_TOKENS=64
fi
set -o pipefail
timeout -k 10 "${LIMIT_S:-575}" bash .gpu/call2/serve.sh python3 bench/gpu/tokens_ab_gpu.py \
  "s15-$shape" 256 2>&1 | tee "$OUT/call-$shape.log"
rc=$?
kill "$sampler"
echo "run_s15 $shape exit $rc"
exit "$rc"
