"""Identifiers. Job ids sort by creation time (the store lists jobs by id, and
pagination relies on that order), and stay unique across broker restarts."""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last = 0
_stream = 0  # which process of one broker makes the ids (0: the core; API workers 1..)
# Random bytes from the OS, drawn a block at a time (random_hex). Why: os.urandom is a
# getrandom(2) system call that releases the GIL; one per job id and one per audit
# record made two thread switches per SubmitJob under concurrent callers.
_RANDOM_BLOCK = 4096
_random = b""
_random_at = 0
_random_pid = 0


def set_stream(stream: int) -> None:
    """Give this process its own id stream (an API worker: its slot + 1). Why: one
    process never repeats an id (the microsecond counter only moves up), but two
    processes creating jobs in the same microsecond would share one random byte's
    chances (a duplicate id refuses a new submit); distinct streams never collide."""
    global _stream
    if not 0 <= stream <= 255:
        raise ValueError(f"id stream {stream} is outside 0..255")
    _stream = stream


def random_hex(nbytes: int) -> str:
    """``nbytes`` bytes from the OS's random source as hex, as ``secrets.token_hex``
    gives them, but one system call per 4 KiB drawn rather than one per call. The
    bytes are handed out once each, in order; a forked child (API workers are spawned,
    not forked) would repeat its parent's unused block, so the block is per process id."""
    global _random, _random_at, _random_pid
    with _lock:
        if _random_at + nbytes > len(_random) or _random_pid != os.getpid():
            _random, _random_at, _random_pid = os.urandom(max(_RANDOM_BLOCK, nbytes)), 0, os.getpid()
        out = _random[_random_at:_random_at + nbytes]
        _random_at += nbytes
    return out.hex()


def new_job_id() -> str:
    """``j-<13 hex digits of microseconds><2 hex: the process's stream><2 random hex>``:
    sortable, unique across the processes of one broker (:func:`set_stream`)."""
    global _last
    with _lock:
        now = max(int(time.time() * 1_000_000), _last + 1)
        _last = now
    return f"j-{now:013x}{_stream:02x}{random_hex(1)}"


def new_command_id() -> str:
    return "c-" + uuid.uuid4().hex[:16]


def new_plan_id() -> str:
    return "tp-" + uuid.uuid4().hex[:12]
