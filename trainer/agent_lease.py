"""The agent's lease on this attempt: stop training when the agent lost its broker.

Why: a region agent that cannot reach any broker (a network partition, or the agent
daemon itself frozen by SIGSTOP) may be declared lost by the broker, which then relaunches
the job on another agent. A partitioned agent kills its attempts itself (self-fence,
``region_agents/fencing.py``), but a *frozen* agent cannot, and its ranks would train on
next to the relaunch. So the agent keeps ``CB_AGENT_LEASE_FILE`` up to date with the
wall-clock time until which its attempts may run (the self-fence deadline: 3/4 of the
broker's agent timeout after the last broker answer), and every rank runs a watchdog
thread that exits the process, without a checkpoint, once that time has passed. A frozen
agent stops renewing the file, so its ranks stop in time on their own
(docs/contracts.md §1 and §9).

File format: one line, the deadline as seconds since the epoch (``time.time()``),
optionally followed by more fields for the agent (the time of its last broker contact,
which a restarted agent resumes from). A missing or unreadable file means "no lease" (a
trainer started outside an agent): no watchdog decision is taken on it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from trainer.errors import EXIT_AGENT_LEASE_EXPIRED, record_exit

POLL_S = 0.5


def read_deadline(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def expired(path: str, now: float | None = None) -> float | None:
    """The deadline if it has passed, else None."""
    deadline = read_deadline(path)
    if deadline is None:
        return None
    return deadline if (time.time() if now is None else now) > deadline else None


def lease_expired(env: dict[str, str] | None = None) -> bool:
    """This process runs under an agent lease that has run out."""
    path = (os.environ if env is None else env).get("CB_AGENT_LEASE_FILE", "")
    return bool(path) and expired(path) is not None


def _watch(path: str, rank: str) -> None:
    while True:
        deadline = expired(path)
        if deadline is not None:
            print(f"trainer (rank {rank}): the agent's lease ran out {time.time() - deadline:.1f}s"
                  " ago (it lost its broker, which may relaunch this job elsewhere): stopping"
                  " without a checkpoint", file=sys.stderr, flush=True)
            record_exit(EXIT_AGENT_LEASE_EXPIRED)
            os._exit(EXIT_AGENT_LEASE_EXPIRED)
        time.sleep(POLL_S)


def start_watchdog(env: dict[str, str] | None = None) -> threading.Thread | None:
    """Start the watchdog when the agent gave us a lease file; None otherwise."""
    env = dict(os.environ if env is None else env)
    path = env.get("CB_AGENT_LEASE_FILE", "")
    if not path:
        return None
    t = threading.Thread(target=_watch, args=(path, env.get("RANK", "0")),
                         name="agent-lease", daemon=True)
    t.start()
    return t
