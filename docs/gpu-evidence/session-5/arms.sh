#!/bin/bash
# Call 3 of issue 24's H200 run (from the project root, after stage.sh and the call carrying
# .gpu/extra): EAGLE-3 on vLLM 0.26's V2 runner with CUDA graphs, without and with async
# scheduling; each arm is bench/gpu/validate.py against a server serve.sh started.
set -u
# call 2 copied .gpu/extra to /opt/extra (outside the checkout, as stage.sh's /opt/stage)
[ -d /opt/extra ] || { echo 'no /opt/extra: run call 2 first'; exit 3; }
python3 /opt/extra/pick_extras.py .gpu/call2/whl-extra
cp /opt/extra/project/*.whl .gpu/call2/project/
ls .gpu/call2/project .gpu/call2/whl-extra
H="v1_step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
H="$H,v2_step=vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
H="$H,v2_propose=vllm.v1.worker.gpu.spec_decode.autoregressive.speculator:AutoRegressiveSpeculator.propose"
H="$H,v1_propose=vllm.v1.spec_decode.eagle:EagleProposer.propose"
H="$H,fwd=vllm.model_executor.models.llama:LlamaModel.forward"
H="$H,fwd_dev=vllm.model_executor.models.llama:LlamaModel.forward@device"
SPEC='{"method":"eagle3","model":"/opt/extra/eagle3","num_speculative_tokens":3}'
export VERIFIER_HOOKS="$H" SPEC_RUNS=1 WAIT_RUN=spec_live ENFORCE_EAGER=0 READY_TIMEOUT=240 LOAD_SECONDS=12
VLLM_SERVE_ARGS="--speculative-config $SPEC" timeout -k 10 260 \
  bash .gpu/call2/serve.sh --serve 8000 python3 bench/gpu/validate.py eagle3-graphs
echo "arm 1 exit $?"
VLLM_SERVE_ARGS="--speculative-config $SPEC --async-scheduling" timeout -k 10 230 \
  bash .gpu/call2/serve.sh --serve 8001 python3 bench/gpu/validate.py eagle3-graphs-async
echo "arm 2 exit $?"
# What the runner hands the probe, step by step, in one offline process (scripts/gpu/spec_shapes.py)
VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout -k 5 110 bash .gpu/call2/serve.sh python3 scripts/gpu/spec_shapes.py \
  --model "$PWD/.gpu/call2/model" --draft /opt/extra/eagle3 --async-scheduling \
  > "$OUT/spec_shapes.jsonl" 2> "$OUT/spec_shapes.err"
echo "spec_shapes exit $?"
