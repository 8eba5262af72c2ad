"""The progress file rank 0 writes for its agent (docs/contracts.md section 2).

Atomic: write `<file>.tmp`, then `os.replace`, so the agent never reads half a JSON.
A heartbeat thread rewrites it every `heartbeat_s` even when a step is slow (or a save
is uploading), so the agent's hang detection watches liveness, not step speed.
On ranks other than 0 every method is a no-op.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any


class ProgressReporter:
    def __init__(self, path: str, enabled: bool, base: dict[str, Any], heartbeat_s: float) -> None:
        self.path = path
        self.enabled = enabled and bool(path)
        self.heartbeat_s = heartbeat_s
        self._lock = threading.Lock()
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

    def update(self, **fields: Any) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._state.update(fields)
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

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            # a full disk must not kill training; the next beat retries
            with contextlib.suppress(OSError):
                self._write()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
