#!/bin/bash
# Session 9, second machine: the default-scheduling EAGLE-3 arm again, with the environ fix.
set -u
export HOME=${HOME:-/root}
python3 /opt/extra/pick_extras.py .gpu/call2/whl-extra >/dev/null
cp /opt/extra/project/*.whl .gpu/call2/project/
H="v1_step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
H="$H,v2_step=vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
H="$H,v2_propose=vllm.v1.worker.gpu.spec_decode.autoregressive.speculator:AutoRegressiveSpeculator.propose"
H="$H,v1_propose=vllm.v1.spec_decode.eagle:EagleProposer.propose"
H="$H,fwd=vllm.model_executor.models.llama:LlamaModel.forward"
H="$H,fwd_dev=vllm.model_executor.models.llama:LlamaModel.forward@device"
SPEC='{"method":"eagle3","model":"/opt/extra/eagle3","num_speculative_tokens":3}'
export VERIFIER_HOOKS="$H" SPEC_RUNS=1 WAIT_RUN=spec_live ENFORCE_EAGER=0 READY_TIMEOUT=200 LOAD_SECONDS=12
export ALLOW_DRIFT=provenance.pth.unclaimed
VLLM_SERVE_ARGS="--speculative-config $SPEC" timeout -k 10 255 \
  bash .gpu/call2/serve.sh --serve 8000 python3 bench/gpu/validate.py eagle3-default-fixed
echo "arm default-fixed exit $?"
