#!/bin/bash
# Session 18, calls 2 and 3, both `mixed` (after call 1, which left /tmp/vllm.tar.xz.a on the same
# machine). Session 17's run_s17.sh with only its names changed (s17 -> s18: labels, abort marker,
# TREE.txt's path) and this header; the two calls' $OUT/tokens_ab.jsonl pool with
# `python bench/tokens_ab.py --pool FILE1 FILE2`. Session 17's header follows:
#
# the probe's tokens/s cost at batch 256 with bench/gpu/tokens_ab_gpu.py's sandwich design, the
# speed reference, the step timer, drain() and the finish step, arms A1 A2 B C D; the verdict's
# estimator the speed-adjusted paired median (declared in bench/tokens_ab.py before these runs).
#
#   bash docs/gpu-evidence/session-18/run_s18.sh decode   # 32-token prompts, vLLM's default batching
#   bash docs/gpu-evidence/session-18/run_s18.sh mixed    # 128-token prompts, 512-token chunks, hooks
#
# Device call: carry [".gpu/call2", ".gpu/split2"], timeout_s 600.
# Staging, only where /opt/stage is not there yet (session 18: the first mixed call): the tracked tree (6.1 MiB)
# plus .gpu/vllm (58.0 MiB) is over the 64 MiB a call carries, so vllm.tar.xz travels split as
# in session 15: call 1 carried .gpu/split1/vllm.tar.xz.a (the first 57,671,680 bytes) and
# copied it to /tmp; this call joins it with .gpu/split2/vllm.tar.xz.b, checks the sha256 and
# runs the kit's stage.sh. The probe's wheel is in .gpu/call2/project beside prepare.sh's
# (python3 -m pip wheel --no-deps -w .gpu/call2/project ./probe).
#
# Time: the bench's rounds stop at BUDGET_S (420) or RESERVE_S (40) before DEADLINE, this
# script's start + DEADLINE_S (565), whichever comes first; the bench is killed at LIMIT_S (585).
# A call that ends with no round recorded (or fails its staging) leaves /tmp/s18-abort, and a
# later call on the same machine then does not run (the same failure would only spend the device
# time again); a call that recorded rounds leaves no marker, so the second mixed call runs.
#
# Writes under $OUT: host-SHAPE.txt, procstat-SHAPE.log (/proc/stat's cpu line every second),
# stage-SHAPE.log (where it staged), call-SHAPE.log, tokens_ab.jsonl, rounds.jsonl.
set -u
shape=${1:?decode or mixed}
t_start=$(date +%s)
export HOME=${HOME:-/root}
if [ -f /tmp/s18-abort ]; then
  echo "run_s18 $shape: not run: $(cat /tmp/s18-abort)"; exit 4
fi
cat docs/gpu-evidence/session-18/TREE.txt 2>/dev/null
if [ ! -f /opt/stage/vllm/__init__.py ]; then
  [ -f /tmp/vllm.tar.xz.a ] || { echo "run_s18 $shape: no /opt/stage and no /tmp/vllm.tar.xz.a (call 1 did not run on this machine)"; exit 3; }
  mkdir -p /tmp/vstage && cat /tmp/vllm.tar.xz.a .gpu/split2/vllm.tar.xz.b > /tmp/vstage/vllm.tar.xz \
    && cp .gpu/split2/stage.sh /tmp/vstage/ \
    && [ "$(sha256sum < /tmp/vstage/vllm.tar.xz | cut -c1-64)" = "$(cat .gpu/split2/vllm.tar.xz.sha256)" ] \
    && bash /tmp/vstage/stage.sh > "$OUT/stage-$shape.log" 2>&1 \
    || { echo "run_s18 $shape: staging failed"; cat "$OUT/stage-$shape.log" 2>/dev/null; echo "staging failed in the $shape call" > /tmp/s18-abort; exit 3; }
  cat "$OUT/stage-$shape.log"
else
  echo "run_s18 $shape: /opt/stage is there (staged by an earlier call on this machine)"
fi
{ date -u; uname -a; nproc; lscpu; nvidia-smi; head -1 /proc/stat; } > "$OUT/host-$shape.txt" 2>&1
(while sleep 1; do echo "$(date +%s.%N) $(head -1 /proc/stat)"; done) > "$OUT/procstat-$shape.log" 2>&1 &
sampler=$!
export DESIGN=sandwich ARMS="A2 B C D" REF_TURNS=2000 ROUNDS=100000 WARM=2 CONTROL=1.0
export BUDGET_S=${BUDGET_S:-420} RESERVE_S=${RESERVE_S:-40}
export DEADLINE=$(( t_start + ${DEADLINE_S:-565} ))
if [ "$shape" = mixed ]; then  # as session 9's and 15's mixed runs: hooks declared, chunked prefill
  export MAX_BATCHED_TOKENS=512 PROMPT_LEN=128 MAX_TOKENS=64 HOOKS=1
else  # as session 15's decode runs: no hooks, one prefill step
  export PROMPT_LEN=32 MAX_TOKENS=64
fi
left=$(( t_start + ${LIMIT_S:-585} - $(date +%s) ))
set -o pipefail
timeout -k 10 "$left" bash .gpu/call2/serve.sh python3 bench/gpu/tokens_ab_gpu.py \
  "s18-$shape" 256 2>&1 | tee "$OUT/call-$shape.log"
rc=$?
kill "$sampler"
n=$(wc -l < "$OUT/rounds.jsonl" 2>/dev/null || echo 0)
if [ "${n:-0}" -eq 0 ]; then echo "the $shape call ended with exit $rc and no round recorded" > /tmp/s18-abort; fi
echo "run_s18 $shape exit $rc, $n rounds recorded, $(( $(date +%s) - t_start )) s"
exit "$rc"
