"""Waiting for SIGTERM/SIGINT in a daemon's main thread, safely.

Why not ``threading.Event.set()`` in the handler (what the broker, its API workers and
the region agent did): a Python signal handler runs in the main thread between two
bytecodes, and a main thread inside ``Event.wait`` holds the event's lock for a few of
them; ``set()`` then waits for that lock forever. An API worker stuck this way outlived
its killed core, still holding the public port (found 2026-11-24). Logging from a
handler has the same hazard (handler locks). So the handler only stores the signal
number, and the main loop sleeps in short steps (``time.sleep`` holds no lock and lets
handlers run)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable


class StopSignals:
    def __init__(self, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.signals = tuple(signals)
        self.signum = 0  # the first stop signal received (0 = none yet)

    def install(self) -> StopSignals:
        for sig in self.signals:
            signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self.signum:
            self.signum = signum

    def wait(self, until: Callable[[], bool] | None = None, step_s: float = 0.2) -> int:
        """Until a stop signal (its number) or ``until()`` is true (0)."""
        while not self.signum:
            if until is not None and until():
                return 0
            time.sleep(step_s)
        if signal.SIGTERM in self.signals:
            # Stopping already: later SIGTERMs (a supervisor's burst, PDEATHSIG) are
            # ignored. Left to Python, its finalization puts SIGTERM back to the default
            # action and one arriving then kills the exiting process (-15, not its code).
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return self.signum
