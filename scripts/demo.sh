#!/usr/bin/env bash
# The README's demo command: installs Compute Broker and runs `brokerctl demo`
# (embedded broker with SQLite state, three simulated regions as real agent
# processes, real trainer processes, local checkpoint directories).
#   bash scripts/demo.sh [brokerctl demo flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/brokerctl demo "$@"
