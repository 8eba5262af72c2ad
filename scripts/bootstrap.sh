#!/usr/bin/env bash
# Installs everything Compute Broker needs into ./.venv (idempotent).
#   bash scripts/bootstrap.sh          runtime only (demo)
#   bash scripts/bootstrap.sh test     runtime + test/bench tools + redis-server + chromium
# torch is pinned to 2.13.0 here: an unpinned torch pulls GBs of CUDA wheels,
# while the pinned version installs the CPU build (pyproject allows a range).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo ">> creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
"$VPY" -m pip install -q --upgrade pip >/dev/null
if ! "$VPY" -c "import torch" 2>/dev/null; then
  echo ">> installing torch==2.13.0 (CPU build)"
  "$VPY" -m pip install -q "torch==2.13.0"
fi
extra="[s3demo]"  # moto[server]: `brokerctl demo --s3` runs a local S3 API server
if [ "${1:-}" = "test" ]; then
  extra="[test,s3demo]"
  # Debian packages: redis-server (HA store tests), chromium (console tests: Playwright
  # drives it at /usr/bin/chromium; no browser is ever downloaded by `playwright install`).
  missing=""
  command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
  [ -x /usr/bin/chromium ] || missing="$missing chromium"
  if [ -n "$missing" ]; then
    echo ">> installing$missing (Debian packages)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
  fi
fi
echo ">> installing compute-broker${extra} (editable)"
"$VPY" -m pip install -q -e ".${extra}"
