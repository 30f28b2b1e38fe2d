# The verifier image: `verifier serve` (central verifier) and `verifier agent` (the sidecar).
#
#   docker build -t verifier:local .
#
# BASE_IMAGE is any Debian-like image with python3 >= 3.11 and its venv module. This project's
# tests build it from a local base (scripts/images.sh: mmdebstrap | docker import), because no
# image registry is reachable there; WHEELS then points pip at a local wheel folder served over
# HTTP instead of PyPI, so the build needs no network and no CA bundle of the host.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG WHEELS=
COPY pyproject.toml README.md /src/
COPY servewitness /src/servewitness
COPY probe /src/probe
RUN set -eu; \
    if [ -n "$WHEELS" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS"; fi; \
    python3 -m venv /opt/verifier; \
    /opt/verifier/bin/pip install --no-cache-dir --disable-pip-version-check /src/probe /src; \
    rm -rf /src; \
    /opt/verifier/bin/verifier --help >/dev/null

# `verifier serve` runs as an unprivileged user (uid/gid 10001, home and database directory
# /var/lib/verifier); the agent sidecar runs as root in its own deployments (compose `user:
# root`, Kubernetes runAsUser 0: vLLM's probe files may be readable by their owner only).
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/verifier --create-home \
        --shell /usr/sbin/nologin verifier
USER 10001:10001
WORKDIR /var/lib/verifier
ENV PATH=/opt/verifier/bin:$PATH \
    HOME=/var/lib/verifier \
    PYTHONUNBUFFERED=1
# serve: gRPC (agents, clients and health) on 50551; agent --health: 50552
EXPOSE 50551 50552
ENTRYPOINT ["verifier"]
CMD ["--help"]
