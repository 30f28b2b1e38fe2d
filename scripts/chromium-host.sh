#!/usr/bin/env bash
# Debian's chromium, for tests/test_report_html.py: it opens `verifier report`'s page in a real
# headless browser (screenshot, DOM). Idempotent: nothing to do where `chromium` runs.
# Usage: scripts/chromium-host.sh
set -euo pipefail
if command -v chromium >/dev/null && chromium --version >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "chromium-host: chromium is not installed and installing it needs root" >&2
  exit 1
fi
echo "chromium-host: installing Debian's chromium package"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
chromium --version
