#!/usr/bin/env bash
# Make a Docker engine answer on this machine, for the container tests and deploy/compose.yaml:
#  - install Debian's docker.io, mmdebstrap and docker-compose when missing (needs root + apt);
#  - start dockerd by hand when nothing answers (its init script does not work on these
#    machines); its log goes to .scratch/dockerd.log;
#  - where the docker CLI has no compose plugin, install a CLI-plugin shim that hands
#    `docker compose ...` to docker-compose v1 (Debian bookworm has no compose v2).
# Idempotent: on a machine where `docker info` and `docker compose version` answer, it does
# nothing. Usage: scripts/docker-host.sh
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v docker-compose >/dev/null || need+=(docker-compose)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "docker-host: need root to install ${need[*]}" >&2; exit 2; }
  echo "docker-host: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  mkdir -p .scratch
  echo "docker-host: starting dockerd (log: .scratch/dockerd.log)"
  nohup dockerd >.scratch/dockerd.log 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || {
    echo "docker-host: dockerd did not come up; its log:" >&2
    tail -20 .scratch/dockerd.log >&2
    exit 2
  }
fi
if ! docker compose version >/dev/null 2>&1; then
  dir=/usr/local/lib/docker/cli-plugins
  mkdir -p "$dir"
  cat >"$dir/docker-compose" <<'SHIM'
#!/bin/sh
# Installed by scripts/docker-host.sh: `docker compose` through docker-compose v1.
if [ "${1:-}" = "docker-cli-plugin-metadata" ]; then
  echo '{"SchemaVersion":"0.1.0","Vendor":"servewitness","Version":"v1-shim","ShortDescription":"docker-compose v1 as docker compose"}'
  exit 0
fi
shift
exec docker-compose "$@"
SHIM
  chmod 0755 "$dir/docker-compose"
  docker compose version >/dev/null 2>&1 || { echo "docker-host: docker compose still fails" >&2; exit 2; }
fi
echo "docker-host: $(docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'); $(docker compose version 2>/dev/null | head -1)"
