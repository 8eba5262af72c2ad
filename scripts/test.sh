#!/usr/bin/env bash
# The README's test command: installs test needs (venvs, torch, redis-server, moto's S3
# server, Chromium, the Kubernetes control plane built from the Go module proxy) and runs
# lint, the stub-freshness check and the whole suite.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
echo ">> Kubernetes control plane (built once per machine from the Go module proxy)"
CB_K8S_BIN=$(bash scripts/k8s/build.sh | tail -n 1)
export CB_K8S_BIN
echo ">> ruff check"
.venv/bin/ruff check .
echo ">> pytest"
set +e
.venv/bin/python -m pytest -ra --durations=60 --durations-min=1.0 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure for this project" >&2
  exit 1
fi
exit "$rc"
