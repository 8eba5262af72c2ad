"""The progress file rank 0 writes for its agent (docs/contracts.md section 2).

Atomic: write `<file>.tmp`, then `os.replace`, so the agent never reads half a JSON.
A heartbeat thread rewrites it every `heartbeat_s` even when a step is slow (or a save
is uploading), so the agent's hang detection watches liveness, not step speed; it also
writes each step's numbers within FLUSH_S (state changes and durable checkpoints are
written at once, from the calling thread).
On ranks other than 0 every method is a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any

FLUSH_S = 0.25  # a step's update reaches the file within this (the agent reads ~1/s)


class ProgressReporter:
    def __init__(self, path: str, enabled: bool, base: dict[str, Any], heartbeat_s: float) -> None:
        self.path = path
        self.enabled = enabled and bool(path)
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
        self._dirty = False
        self._last_write = 0.0
        self._state: dict[str, Any] = {
            "state": "starting",
            "step": 0,
            "samples_seen": 0,
            "loss": None,
            "tokens_per_s": 0.0,
            "last_checkpoint_step": None,
            "last_checkpoint_uri": None,
            **base,
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.enabled:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._write()
        self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def update(self, lazy: bool = False, **fields: Any) -> None:
        """Merge `fields`; written now, or with `lazy` (per-step numbers) by the heartbeat
        thread within FLUSH_S. Why lazy: a write costs about a millisecond on a busy
        disk, 1% of a 100 ms step on the training thread (benchmarks/bench_library.py),
        while the agent reads the file about once a second."""
        if not self.enabled:
            return
        with self._lock:
            self._state.update(fields)
            self._dirty = True
        if not lazy:
            self._write()

    def checkpoint_durable(self, step: int, uri: str) -> None:
        """Called when a checkpoint's manifest is committed (any thread)."""
        with self._lock:
            prev = self._state.get("last_checkpoint_step")
            if prev is not None and prev > step:
                return
        self.update(last_checkpoint_step=step, last_checkpoint_uri=uri)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._state)

    def _write(self) -> None:
        with self._lock:
            now = time.time()
            self._state["time"] = now
            self._state["heartbeat"] = now
            data = json.dumps(self._state, sort_keys=True)
            tmp = f"{self.path}.tmp"
            # no fsync: os.replace alone makes the swap atomic for the agent reading it
            # on this host, and only a host crash (which ends the agent too) could lose
            # the page-cache copy; an fsync per step cost ms on a busy disk
            # (benchmarks/bench_library.py) for nothing anyone could observe.
            with open(tmp, "w") as f:
                f.write(data)
            os.replace(tmp, self.path)
            self._dirty, self._last_write = False, time.monotonic()

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, FLUSH_S)):
            with self._lock:
                due = self._dirty or time.monotonic() - self._last_write >= self.heartbeat_s
            if due:  # a full disk must not kill training; the next beat retries
                with contextlib.suppress(OSError):
                    self._write()

    def stop(self) -> None:
        """Stop the heartbeat; a step's numbers not yet written are written now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.enabled and self._dirty:
            with contextlib.suppress(OSError):
                self._write()
