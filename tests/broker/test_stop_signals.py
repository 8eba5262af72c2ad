"""broker/stop_signals.py: a daemon's main thread waiting for SIGTERM never deadlocks.

The bug it replaced: ``threading.Event.set()`` in a signal handler while the main thread
sat in ``Event.wait`` could wait forever for the event's own lock (an API worker
outlived its core that way). Real processes, real signals, many of them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import sys, time
from broker.stop_signals import StopSignals
stops = StopSignals().install()
print("ready", flush=True)
sys.exit(0 if stops.wait() == 15 else 3)
"""


def test_a_storm_of_sigterms_ends_the_wait_once() -> None:
    for _ in range(5):
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
            for _ in range(200):  # a burst, as PDEATHSIG + a supervisor's SIGTERM can be
                child.send_signal(signal.SIGTERM)
            assert child.wait(10) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_wait_returns_when_until_is_true() -> None:
    from broker.stop_signals import StopSignals

    stops = StopSignals(signals=())  # nothing installed: the pytest process keeps its own
    t0 = time.monotonic()
    assert stops.wait(until=lambda: time.monotonic() - t0 > 0.1, step_s=0.01) == 0
