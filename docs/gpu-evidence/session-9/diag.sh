#!/bin/bash
set -u
export HOME=${HOME:-/root}
python3 /opt/extra/pick_extras.py .gpu/call2/whl-extra >/dev/null
cp /opt/extra/project/*.whl .gpu/call2/project/
uname -a; cat /proc/version; dmesg 2>/dev/null | head -3
ENFORCE_EAGER=1 READY_TIMEOUT=200 timeout -k 10 250 bash .gpu/call2/serve.sh --serve 8000 \
  bash -c 'python3 .gpu/diag/envdiag.py $VLLM_API_PID; HOME=/root python3 .gpu/diag/retitle.py spawn 2>&1 | tail -3'
