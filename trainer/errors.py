"""Errors the trainer reports as "retrying will not help" (exit code 2).

Why a dedicated type: the contract (docs/contracts.md) says bad configuration, a
corrupt or incompatible checkpoint and unreachable storage exit with code 2 and one
clear paragraph on stderr, never a torch traceback. Raising `TrainerError` anywhere
and catching it once in `__main__` keeps that promise in one place.
"""

from __future__ import annotations

import contextlib
import os

from checkpoint_layout.faults import EXIT_STORE_UNAVAILABLE as _STORE_UNAVAILABLE

EXIT_OK = 0
EXIT_BAD_CONFIG = 2
EXIT_CHECKPOINTED = 75
# SIGTERM'd but the emergency checkpoint could not be durable within CB_GRACE_S: exit
# before the agent's SIGKILL can land mid-write; the previous complete checkpoint stays
# the latest (no manifest was written). The agent reports it as a failure (relaunch).
EXIT_GRACE_EXCEEDED = 76
# CB_RESUME_FROM is gone or incomplete (an older attempt that is still running pruned
# it, or the store has not caught up): not a configuration error, the broker relaunches.
EXIT_RESUME_UNAVAILABLE = 77
# The agent's lease (CB_AGENT_LEASE_FILE) ran out: the agent lost its broker, which may
# relaunch this job elsewhere, so the ranks stop at once (trainer/agent_lease.py).
EXIT_AGENT_LEASE_EXPIRED = 78
# A checkpoint save failed after bounded storage retries (CheckpointSaveError): the
# broker relaunches from the last durable checkpoint, and no node is blamed: the
# store failed, not the machine (blaming it excluded nodes for good; the fault
# campaign's S3 503 bursts could leave a job nowhere to run).
EXIT_STORAGE_FAILED = 79
# The rendezvous port (MASTER_PORT) was taken by another process between the agent
# choosing it and rank 0 listening on it: nobody's fault here, the broker relaunches
# (with a new port) and no node is blamed. Seen once in the fault campaign, as a raw
# torch traceback, before the agent chose ports outside the kernel's ephemeral range.
EXIT_RENDEZVOUS_PORT_TAKEN = 80
# The checkpoint store is down (refused, reset, DNS, timeout, 5xx, throttling:
# checkpoint_layout/faults.py): not the job's fault, so not exit 2; the broker waits
# with backoff and relaunches without spending a restart.
EXIT_STORE_UNAVAILABLE = _STORE_UNAVAILABLE




def record_exit(code: int) -> None:
    """Write this rank's exit code to ``CB_EXIT_FILE`` just before it exits.

    Why: an agent restarted while the ranks ran re-adopts them, but they are no longer
    its children, so their exit status is lost to it. In the 200-job fault campaign a
    re-adopted attempt finished every step, rank 1 exited 0 a moment before rank 0 wrote
    "done", and the agent took rank 1's unknown status for a crash: it killed rank 0,
    blamed the node and relaunched. The file is the rank's own word (docs/contracts.md
    section 1); a rank killed by a signal writes nothing and stays "unknown"."""
    path = os.environ.get("CB_EXIT_FILE", "")
    if not path:
        return
    with contextlib.suppress(OSError):  # exiting anyway: never fail on the way out
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{int(code)}\n")
        os.replace(tmp, path)


class TrainerError(Exception):
    """A user-facing failure: bad config, bad checkpoint, unreachable storage."""


class CheckpointSaveError(Exception):
    """A checkpoint save failed (storage kept failing after bounded retries, disk full).

    Not a TrainerError: the storage may recover, so the process exits 1 (crash, the
    broker relaunches from the last durable checkpoint), but with one clear line
    instead of DCP's per-rank tracebacks."""


class ResumeUnavailable(Exception):
    """The checkpoint to resume from is missing or incomplete (docs/contracts.md section 1).

    Not a TrainerError: nothing is wrong with the job's configuration, and the next
    attempt resumes from the broker's latest record (the agent resolves a pruned one to
    the newest complete checkpoint of the same directory first), so the process exits
    EXIT_RESUME_UNAVAILABLE with one line and the broker relaunches it."""


class StoreUnavailable(Exception):
    """The checkpoint store is unreachable or overloaded (an outage by
    checkpoint_layout/faults.py), as opposed to misconfigured (TrainerError).

    Why its own type: the broker must neither fail the job (exit 2) nor spend a restart
    on it (exit 77); exit EXIT_STORE_UNAVAILABLE makes it wait for the store."""



class PeerCrashed(RuntimeError):
    """Another rank crashed in a step the ranks agree on (trainer/agree.py): this rank
    stops with it, with one line (exit 1); the crashed rank's traceback is its own."""
