"""Fencing: which commands an agent may obey (docs/contracts.md section 6, rule 5).

Why a separate, pure object: the attempt number is the fencing token that keeps
a partitioned agent from double-running a job, so its rules deserve their own
tests, free of threads and sockets.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    accepted: bool
    message: str = ""
    kill_attempt: int = 0  # an older attempt of the same job to kill first (0 = none)
    duplicate: bool = False  # the very same attempt is already running: ack, do nothing


class AttemptLedger:
    """Highest attempt seen per job, and the attempt running now (if any)."""

    def __init__(self) -> None:
        self.highest: dict[str, int] = {}
        self.running: dict[str, int] = {}

    def on_launch(self, job_id: str, attempt: int) -> Decision:
        seen = self.highest.get(job_id, 0)
        if attempt < seen:
            return Decision(False, f"stale attempt {attempt} for {job_id}: attempt {seen} already seen")
        current = self.running.get(job_id)
        if attempt == seen and current == attempt:
            return Decision(True, f"attempt {attempt} of {job_id} already running", duplicate=True)
        if attempt == seen and seen:
            return Decision(False, f"attempt {attempt} of {job_id} already ran here")
        return Decision(True, "", kill_attempt=current or 0)

    def on_stop(self, job_id: str, attempt: int) -> Decision:
        current = self.running.get(job_id)
        if current is None:
            return Decision(False, f"{job_id} is not running here")
        if current != attempt:
            return Decision(False, f"{job_id} runs attempt {current} here, not {attempt}")
        return Decision(True)

    def launched(self, job_id: str, attempt: int) -> None:
        self.highest[job_id] = max(attempt, self.highest.get(job_id, 0))
        self.running[job_id] = attempt

    def seen(self, job_id: str, attempt: int) -> None:
        """Record an attempt we learnt about without launching it (e.g. adopted)."""
        self.highest[job_id] = max(attempt, self.highest.get(job_id, 0))

    def finished(self, job_id: str, attempt: int) -> None:
        if self.running.get(job_id) == attempt:
            del self.running[job_id]


# ---- self-fence: a partitioned agent stops its own attempts (docs/contracts.md §9) ----------
# The broker declares an agent lost after ``agent_timeout_s`` (T) without a message from it
# and may then relaunch the agent's jobs elsewhere at once. An agent that cannot reach any
# broker kills its attempts after F = SELF_FENCE_FRACTION * T of silence, measured from the
# *send* time of the newest message the broker answered (that message reached the broker
# no earlier, so the broker's own silence clock started no earlier than ours). Killing
# (SIGKILL of the process groups, next agent tick) takes well under the remaining
# (1 - SELF_FENCE_FRACTION) * T, and the relaunch still has to spawn, import torch, load
# the checkpoint and step. Invariant: F + kill time < T <= T + relaunch delay.
SELF_FENCE_FRACTION = 0.75
DEFAULT_AGENT_TIMEOUT_S = 20.0  # the broker's default, until a RegisterAck says otherwise
MAX_UNANSWERED = 4096  # heartbeats kept awaiting an ack (a long partition must not grow it)


LEASE_MARGIN_FRACTION = 0.05  # the ranks' own deadline (CB_AGENT_LEASE_FILE) is this much later


def lease_margin(agent_timeout_s: float) -> float:
    """How much later than the agent's self-fence the ranks' watchdog fires: a live agent
    kills first (and logs it); a frozen one cannot, and the watchdog still stops the ranks
    at 0.8 T, inside the broker's agent timeout T."""
    return LEASE_MARGIN_FRACTION * (agent_timeout_s if agent_timeout_s > 0 else DEFAULT_AGENT_TIMEOUT_S)


def self_fence_after(agent_timeout_s: float, configured: float | None = None) -> float:
    """Seconds without a broker answer after which the agent kills its own attempts.

    ``configured`` (``--self-fence-s``) may only make it shorter: a longer deadline would
    break the invariant above and let two attempts of one job train at once."""
    limit = SELF_FENCE_FRACTION * (agent_timeout_s if agent_timeout_s > 0 else DEFAULT_AGENT_TIMEOUT_S)
    return min(configured, limit) if configured and configured > 0 else limit


class BrokerContact:
    """When did a broker last prove it heard us? The send time (agent's monotonic clock)
    of the newest Register or Heartbeat that was answered. Pure: the agent feeds it."""

    def __init__(self, now: float) -> None:
        self.last = now  # start-up counts as contact: adopted attempts get a full deadline
        self._unanswered: deque[float] = deque(maxlen=MAX_UNANSWERED)
        # the stream's reader credits acks at once, without the agent's lock
        self._lock = threading.Lock()

    def new_session(self) -> None:
        """Acks come in order on one stream; a new stream starts a new sequence."""
        with self._lock:
            self._unanswered.clear()

    def registered(self, register_sent: float) -> None:
        with self._lock:
            self.last = max(self.last, register_sent)

    def heartbeat_sent(self, now: float) -> None:
        with self._lock:
            self._unanswered.append(now)

    def heartbeat_acked(self) -> None:
        """The oldest unanswered heartbeat was answered (an ack lost in between makes us
        credit an older send time: the safe direction)."""
        with self._lock:
            if self._unanswered:
                self.last = max(self.last, self._unanswered.popleft())

    def silent_for(self, now: float) -> float:
        return now - self.last
