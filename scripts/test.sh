#!/usr/bin/env bash
# The README's test command: installs test needs (venv, torch CPU, redis-server,
# moto's S3 server) and runs lint, the stub-freshness check and the whole suite.
#   bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh test
echo ">> ruff check"
.venv/bin/ruff check .
echo ">> pytest"
set +e
.venv/bin/python -m pytest -ra --durations=15 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure for this project" >&2
  exit 1
fi
exit "$rc"
