#!/usr/bin/env bash
# PostgreSQL server binaries for the tests and benchmarks of the fleet store (Debian's
# postgresql package; the tests start their own throwaway server, never the system one).
# Idempotent. Usage: scripts/postgres-host.sh
set -euo pipefail
if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "postgres-host: PostgreSQL is not installed and installing it needs root" >&2
  exit 1
fi
echo "postgres-host: installing Debian's postgresql package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# The package may start a cluster of its own; the tests do not use it.
command -v pg_ctlcluster >/dev/null && pg_lsclusters -h 2>/dev/null | while read -r ver name _; do
  pg_ctlcluster "$ver" "$name" stop 2>/dev/null || true
done
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
