#!/usr/bin/env bash
# Run a broker and a region agent by hand, give a team a quota, submit a job and wait
# for it: the operator guide's walkthrough (docs/operator/by-hand.md shows this file).
#   source .venv/bin/activate; bash examples/walkthrough.sh [--keep]
# Works in the current directory (writes var/ there); --keep leaves the broker and the
# agent running until Ctrl-C, so you can try more commands from another shell.
set -euo pipefail
EXAMPLES=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if ! command -v brokerctl >/dev/null; then  # not activated: use the checkout's .venv
  [ -x "$EXAMPLES/../.venv/bin/brokerctl" ] || bash "$EXAMPLES/../scripts/bootstrap.sh"
  PATH="$(cd "$EXAMPLES/.." && pwd)/.venv/bin:$PATH"
fi
PORT=${CB_WALKTHROUGH_PORT:-50051}              # TLS, for users' bearer tokens
AGENT_PORT=${CB_WALKTHROUGH_AGENT_PORT:-50052}  # mutual TLS, for region agents
trap 'kill $(jobs -p) 2>/dev/null || true; wait' EXIT
wait_for() {  # wait_for WHAT COMMAND...: retry COMMAND once a second, up to 3 minutes
  local what=$1; shift
  for _ in $(seq 180); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "walkthrough: gave up waiting for $what" >&2; return 1
}

# 1. A development CA: the broker's and the agent's certificates, bootstrap tokens and
#    a client config with contexts admin (operator, the current one), alice (member of
#    team ml) and carol (team admin of ml).
brokerctl dev-ca var/pki --agent us-east-2/us-east-2-a \
    --server 127.0.0.1:$PORT --mtls-server 127.0.0.1:$AGENT_PORT
export CB_CONFIG=$PWD/var/pki/config.yaml

# 2. The broker, state in a SQLite file.
brokerctl serve --config var/pki/broker.yaml --listen 127.0.0.1:$PORT \
    --agent-listen 127.0.0.1:$AGENT_PORT --store sqlite:///var/broker.sqlite &
wait_for "the broker" brokerctl regions

# 3. One region agent on a simulated inventory. An agent running as root refuses to
#    start jobs as root unless told: --run-as-user USER, or --allow-root-jobs on a
#    throwaway machine (this script's choice when it runs as root).
as_root=(); [ "$(id -u)" = 0 ] && as_root=(--allow-root-jobs)
brokerctl agent --broker 127.0.0.1:$AGENT_PORT --region us-east-2 \
    --cert var/pki/agents/us-east-2-a.pem --key var/pki/agents/us-east-2-a.key \
    --ca var/pki/ca.pem --inventory "$EXAMPLES/inventories/us-east-2.yaml" \
    --work-dir var/agents/us-east-2 "${as_root[@]}" &
wait_for "the agent to connect" sh -c 'brokerctl regions | grep -qw connected'

# 4. A team with a quota (as the operator), then alice's job, kept small: one node,
#    6 steps, a checkpoint every 3 (flags override the spec file's fields).
brokerctl teams set ml --guaranteed 16 --cohort research
brokerctl --context alice submit -f "$EXAMPLES/spec.yaml" \
    --nodes 1 --steps 6 --checkpoint-every 3 --wait
brokerctl jobs

echo "walkthrough: done (CB_CONFIG=$CB_CONFIG)"
if [ "${1:-}" = "--keep" ]; then
  echo "walkthrough: broker on 127.0.0.1:$PORT and agent running; Ctrl-C stops them"
  wait
fi
