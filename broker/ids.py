"""Identifiers. Job ids sort by creation time (the store lists jobs by id, and
pagination relies on that order), and stay unique across broker restarts."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0


def new_job_id() -> str:
    """``j-<13 hex digits of microseconds><4 random hex>``: sortable, unique."""
    global _last
    with _lock:
        now = max(int(time.time() * 1_000_000), _last + 1)
        _last = now
    return f"j-{now:013x}{os.urandom(2).hex()}"


def new_command_id() -> str:
    return "c-" + uuid.uuid4().hex[:16]


def new_plan_id() -> str:
    return "tp-" + uuid.uuid4().hex[:12]
