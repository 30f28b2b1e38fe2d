#!/bin/bash
# Session 5, second message: the sync arm (--no-async-scheduling) and the async arm again, with
# validate_s5.py (bindings.jsonl read from the probe's state_dir; [provenance] allow for the image's
# .pth files and late-hashed files), HOME set where the device leaves it unset.
set -u
[ -d /opt/extra ] || { echo 'no /opt/extra: run call 2 first'; exit 3; }
echo "device env: HOME=${HOME-<unset>} USER=${USER-<unset>} XDG_CACHE_HOME=${XDG_CACHE_HOME-<unset>} id=$(id -un) pwdhome=$(getent passwd root | cut -d: -f6)"
export HOME=${HOME:-/root}
python3 /opt/extra/pick_extras.py .gpu/call2/whl-extra
cp /opt/extra/project/*.whl .gpu/call2/project/
H="v1_step=vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
H="$H,v2_step=vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
H="$H,v2_propose=vllm.v1.worker.gpu.spec_decode.autoregressive.speculator:AutoRegressiveSpeculator.propose"
H="$H,v1_propose=vllm.v1.spec_decode.eagle:EagleProposer.propose"
H="$H,fwd=vllm.model_executor.models.llama:LlamaModel.forward"
H="$H,fwd_dev=vllm.model_executor.models.llama:LlamaModel.forward@device"
SPEC='{"method":"eagle3","model":"/opt/extra/eagle3","num_speculative_tokens":3}'
export VERIFIER_HOOKS="$H" SPEC_RUNS=1 WAIT_RUN=spec_live ENFORCE_EAGER=0 READY_TIMEOUT=200 LOAD_SECONDS=12
export EXTRA_PROVENANCE='allow = ["provenance.pth.unclaimed", "provenance.file.changed_after_start"]
'
VLLM_SERVE_ARGS="--speculative-config $SPEC --no-async-scheduling" timeout -k 10 215 \
  bash .gpu/call2/serve.sh --serve 8002 python3 /opt/extra/validate_s5.py eagle3-graphs-sync
echo "arm sync exit $?"
VLLM_SERVE_ARGS="--speculative-config $SPEC --async-scheduling" timeout -k 10 150 \
  bash .gpu/call2/serve.sh --serve 8003 python3 /opt/extra/validate_s5.py eagle3-graphs-async2
echo "arm async2 exit $?"
