"""Which restart budget an attempt's failure spends: one table, applied in one place.

Why two budgets: on a large fleet nodes fail often through no fault of the job (Meta
measured a mean time to failure of 1.8 h per 16k GPUs), so a long job that spent
``max_restarts`` (3 by default) on lost nodes would end FAILED although nothing was
wrong with it; a script that crashes at every start must still stop after
``max_restarts``. The field draws the same line: Kubernetes' ``podFailurePolicy``
``Ignore``s failures with the ``DisruptionTarget`` condition (a node lost, a pod
evicted) instead of counting them against ``backoffLimit``; JobSet's
``failurePolicy.rules`` restart on such reasons with ``RestartJobSetAndIgnoreMaxRestarts``;
Kubeflow's ``restartPolicy: ExitCode`` retries deaths by signal (exit 128-255) and
treats 1-127 as the program's own. Unlike those (which never stop on disruptions) a
node failure here still spends a budget of its own, a rate (``max_node_failures`` in
``node_failure_window_s``), because the local executor cannot tell a node lost from
ranks the OOM killer took (both are a SIGKILL on one node): a job whose ranks are
killed at every start stops within a window instead of running for ever.

The table (:data:`FAILURE_BUDGETS`) maps each :class:`FailureKind` to its
:class:`Budget`; :func:`classify` is the rule that names the kind of a failed attempt;
:meth:`broker.jobs.recovery.RecoveryPolicy.restart` applies both (the one place), and
docs/recovery.md "Restart budgets" is the human copy. Store outages (exit 81) spend no
budget at all (broker/jobs/store_wait.py); configuration errors fail at once.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from checkpoint_layout.crash_blame import Death, death_of

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from computebroker.v1 import common_pb2 as pb

# Submit-time bounds of the spec fields (broker/api/limits.py applies them): ten thousand
# losses are far beyond any real job; a year is the longest window that means anything.
MAX_NODE_FAILURES = 10_000
MAX_NODE_FAILURE_WINDOW_S = 366 * 86_400.0

# Trainer exit codes (docs/contracts.md section 1); broker/jobs/recovery.py re-exports them.
EXIT_ERROR = 1
EXIT_CONFIG_ERROR = 2
# The checkpoint store is down (checkpoint_layout/faults.py): weather, not a failure.
EXIT_STORE_UNAVAILABLE = 81


class FailureKind(enum.Enum):
    """What an attempt that FAILED on its own (no stop asked) tells about its cause."""

    CONFIG_ERROR = "config_error"  # exit 2: the spec or the environment is wrong
    DETERMINISTIC_ERROR = "deterministic_error"  # exit 1 ending in ImportError, SyntaxError...
    STORE_OUTAGE = "store_outage"  # exit 81: the checkpoint store is down
    NODE_LOST = "node_lost"  # a node blamed, and its rank died by a signal (or the agent failed it)
    JOB_ERROR = "job_error"  # anything else: the program's own exit code, a signal on no node


class Budget(enum.Enum):
    """What a failure of a kind spends."""

    NONE = "none"  # fails at once: retrying will not help
    STORE_WAIT = "store_wait"  # waited out with backoff, bounded by store_outage_max_s
    NODE_FAILURES = "max_node_failures"  # the job's node-loss budget (a rate)
    RESTARTS = "max_restarts"  # the job's own failures


# The decision, as data (docs/recovery.md "Restart budgets" is its human copy).
FAILURE_BUDGETS: dict[FailureKind, Budget] = {
    FailureKind.CONFIG_ERROR: Budget.NONE,
    FailureKind.DETERMINISTIC_ERROR: Budget.NONE,
    FailureKind.STORE_OUTAGE: Budget.STORE_WAIT,
    FailureKind.NODE_LOST: Budget.NODE_FAILURES,
    FailureKind.JOB_ERROR: Budget.RESTARTS,
}

# Python errors that fail the same way on any node, every time: the program cannot start
# (a missing module, a syntax error). Seen as the last traceback line of a failing rank's
# stderr (JobUpdate.message); retrying them only delays the failure (3 x the launch time).
DETERMINISTIC_ERRORS = ("ModuleNotFoundError:", "ImportError:", "SyntaxError:",
                        "IndentationError:", "TabError:")


def deterministic_failure(exit_code: int, message: str) -> str:
    """The error line when ``message`` (a failed rank's stderr tail) ends in an error that
    no retry can fix, else "". Only exit 1 (Python's exit for an uncaught exception)."""
    if exit_code != EXIT_ERROR:
        return ""
    for line in reversed(message.strip().splitlines()[-20:]):
        text = line.strip()
        for name in DETERMINISTIC_ERRORS:
            at = text.find(name)
            if at >= 0 and (at == 0 or not text[at - 1].isalnum()):
                return text[at:]
    return ""


def classify(exit_code: int, message: str, failed_nodes: tuple[str, ...] | list[str]) -> FailureKind:
    """The kind of a FAILED attempt's end, from what its agent reported.

    A node loss is a blamed node whose rank died by a signal (``-N``, ``128+N``; a pod
    that could not start, ``-1``): the executors blame the killed rank's node before a
    peer that then failed its collective with an exit code (checkpoint_layout/
    crash_blame.py), and an agent that fails an attempt for an unhealthy node reports
    SIGKILL. A rank that exited with its own code (1: an exception) is the program's
    failure even though its node is blamed too (the relaunch avoids or replaces that
    node all the same)."""
    if exit_code == EXIT_CONFIG_ERROR:
        return FailureKind.CONFIG_ERROR
    if exit_code == EXIT_STORE_UNAVAILABLE:
        return FailureKind.STORE_OUTAGE
    if deterministic_failure(exit_code, message):
        return FailureKind.DETERMINISTIC_ERROR
    if failed_nodes and exit_code != 0 and death_of(exit_code) is Death.KILLED:
        return FailureKind.NODE_LOST
    return FailureKind.JOB_ERROR


def node_limits(job: pb.Job, config: BrokerConfig) -> tuple[int, float]:
    """``(max_node_failures, window seconds)`` of ``job``: its spec's, else the broker's."""
    spec = job.spec
    limit = (spec.max_node_failures if spec.HasField("max_node_failures")
             else config.max_node_failures)
    window = (spec.node_failure_window_s if spec.HasField("node_failure_window_s")
              else config.node_failure_window_s)
    return limit, window


def recent_node_failures(job: pb.Job, config: BrokerConfig, now: float) -> int:
    """Node failures of ``job`` that count now: those inside its window (all of them when
    the window is 0, its whole life)."""
    _, window = node_limits(job, config)
    if not window:
        return job.node_failures
    return sum(1 for t in job.node_failure_times if t > now - window)


def node_budget_left(job: pb.Job, config: BrokerConfig, now: float) -> bool:
    """True when one more node failure still fits the job's budget."""
    limit, _ = node_limits(job, config)
    return recent_node_failures(job, config, now) < limit


def spend_node_failure(job: pb.Job, config: BrokerConfig, now: float) -> None:
    """Count one node failure (on a transaction's private copy): the total, and its time
    among the recent ones (older ones than the window are dropped, so the list stays as
    short as the budget)."""
    job.node_failures += 1
    limit, window = node_limits(job, config)
    keep = [t for t in job.node_failure_times if not window or t > now - window]
    keep = [*keep, now][-max(1, limit + 1):]
    del job.node_failure_times[:]
    job.node_failure_times.extend(keep)


def window_text(window_s: float) -> str:
    """``within 1h`` / ``within 30m`` / ``within 90s``, or ``over the job's life`` (0)."""
    if not window_s:
        return "over the job's life"
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if window_s >= size and window_s % size == 0:
            return f"within {window_s / size:g}{unit}"
    return f"within {window_s:g}s"


def node_budget_text(job: pb.Job, config: BrokerConfig, now: float) -> str:
    """``2/10 within 1h`` (the node failures that count now, of the limit)."""
    limit, window = node_limits(job, config)
    return f"{recent_node_failures(job, config, now)}/{limit} {window_text(window)}"
