#!/bin/bash
# Session 15, decode re-run (after a first call that left /tmp/vllm.tar.xz.a, below): run_s15.sh's
# decode-only batch-256 measurement again, now with drain() in bench/tokens_ab.py (each phase's
# probe bindings folded and written inside its own timing), and with arm D (probe on, bindings
# off) beside B, so the bindings' share is seen. The probe wheel in .gpu/call2/project is the
# one run_s15.sh used (built from probe/ at a40f294; probe/ is unchanged since, checked by diff).
#
#   BUDGET_S=... LIMIT_S=... bash docs/gpu-evidence/session-15/run_decode2.sh
#
# Staging is in this script: the tracked tree (5.85 MiB) plus .gpu/vllm (58.0 MiB) was over the
# device's 64 MiB per call, so vllm.tar.xz travelled split. A first call carried
# .gpu/split1/vllm.tar.xz.a (its first 57,671,680 bytes) and copied it to /tmp; this call
# carries .gpu/call2 and .gpu/split2 (the tail, stage.sh and the tar's sha256), joins the two
# into /tmp/vstage/vllm.tar.xz, checks the sha256 and runs the kit's stage.sh on it.
#
# Writes under $OUT: host-decode2.txt, procstat-decode2.log, call-decode2.log, and the bench's
# tokens_ab.jsonl (at the end) and rounds.jsonl (each round as it ends: kept if cut short).
set -u
mkdir -p /tmp/vstage && cat /tmp/vllm.tar.xz.a .gpu/split2/vllm.tar.xz.b > /tmp/vstage/vllm.tar.xz \
  && cp .gpu/split2/stage.sh /tmp/vstage/ \
  && [ "$(sha256sum < /tmp/vstage/vllm.tar.xz | cut -c1-64)" = "$(cat .gpu/split2/vllm.tar.xz.sha256)" ] \
  && bash /tmp/vstage/stage.sh > "$OUT/stage-decode2.log" 2>&1 || { echo "staging failed"; cat "$OUT/stage-decode2.log"; exit 3; }
cat "$OUT/stage-decode2.log"
export HOME=${HOME:-/root}
{ date -u; uname -a; nproc; lscpu; nvidia-smi; head -1 /proc/stat; } > "$OUT/host-decode2.txt" 2>&1
(while sleep 1; do echo "$(date +%s.%N) $(head -1 /proc/stat)"; done) > "$OUT/procstat-decode2.log" 2>&1 &
sampler=$!
export DESIGN=sandwich ARMS="A2 B C D" REF_TURNS=2000 ROUNDS=100000 WARM=2 CONTROL=1.0
export BUDGET_S=${BUDGET_S:-200} PROMPT_LEN=32 MAX_TOKENS=64  # as run_s15.sh decode: no hooks
set -o pipefail
timeout -k 10 "${LIMIT_S:-330}" bash .gpu/call2/serve.sh python3 bench/gpu/tokens_ab_gpu.py \
  "s15-decode2" 256 2>&1 | tee "$OUT/call-decode2.log"
rc=$?
kill "$sampler"
echo "run_decode2 exit $rc"
exit "$rc"
