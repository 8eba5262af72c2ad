"""The stop deadline file: how a Stop's grace reaches a trainer that is already running.

Why a file (``CB_STOP_DEADLINE_FILE``): the grace a stop allows is only known when the
stop comes (a spot notice leaves about two minutes, a drain the broker's
``preempt_grace_s``, a plan end the time left in the plan), but ``CB_GRACE_S`` is fixed
when the ranks are started and an environment cannot change afterwards. So the agent
writes the stop's absolute deadline (wall clock, the moment it will SIGKILL) into this
file right before it sends SIGTERM, and the trainer reads it when it acts on the
SIGTERM: a long drain grace is honoured and a spot notice's deadline is respected
(docs/contracts.md section 1). No file, or an unreadable one: ``CB_GRACE_S`` applies.

Torch-free (checkpoint_layout): the agent writes it, the trainer reads it. One small
JSON object, written atomically (tmp + rename): ``{"deadline": <epoch s>, "grace_s": <s>}``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from checkpoint_layout.nofollow import replace_file

STOP_DEADLINE_ENV = "CB_STOP_DEADLINE_FILE"
STOP_DEADLINE_NAME = "stop-deadline.json"  # in the attempt directory (local executor)


@dataclass(frozen=True)
class StopDeadline:
    """``deadline``: wall-clock time (``time.time()``) of the agent's SIGKILL;
    ``grace_s``: the grace the stop allowed (for the trainer's safety margin and logs)."""

    deadline: float
    grace_s: float

    def to_json(self) -> str:
        return json.dumps({"deadline": self.deadline, "grace_s": self.grace_s})


def write_stop_deadline(path: str | os.PathLike[str], sd: StopDeadline) -> None:
    """Atomically publish the deadline (a rank never reads half a file)."""
    replace_file(path, sd.to_json())  # the job owns the dir: never through a link


def read_stop_deadline(path: str | os.PathLike[str] | None = None) -> StopDeadline | None:
    """The deadline in ``path`` (default: ``$CB_STOP_DEADLINE_FILE``), or None when there
    is no such file or it does not hold a usable deadline (then CB_GRACE_S applies)."""
    path = path if path is not None else os.environ.get(STOP_DEADLINE_ENV, "")
    if not path:
        return None
    try:
        raw = json.loads(Path(path).read_text())
        sd = StopDeadline(float(raw["deadline"]), float(raw.get("grace_s", 0.0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (math.isfinite(sd.deadline) and sd.deadline > 0 and math.isfinite(sd.grace_s)):
        return None
    return sd
