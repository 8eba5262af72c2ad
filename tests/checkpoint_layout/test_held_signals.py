"""Ranks start with SIGUSR1 blocked and the trainer library unblocks it (held_signals.py):
real child processes, their real signal masks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from checkpoint_layout.held_signals import HELD_AT_START, held_for_children, held_now

REPO = Path(__file__).resolve().parents[2]


def _blocked(pid: int) -> set[int]:
    """The signals blocked in a process's (main) thread, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    raise AssertionError("no SigBlk line")


def test_a_child_starts_blocked_and_the_parent_thread_is_restored() -> None:
    assert {signal.SIGUSR1} == HELD_AT_START  # SIGTERM keeps its meaning: never held
    assert held_now() == frozenset()
    with held_for_children():
        assert held_now() == HELD_AT_START
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert held_now() == frozenset()  # the caller's mask is as before
        assert signal.SIGUSR1 in _blocked(child.pid)
        assert signal.SIGTERM not in _blocked(child.pid)
        os.kill(child.pid, signal.SIGUSR1)  # held: not fatal
        time.sleep(0.3)
        assert child.poll() is None
        child.terminate()  # SIGTERM still ends it
        assert child.wait(10) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_only_the_calling_thread_blocks() -> None:
    seen: list[frozenset] = []
    entered, leave = threading.Event(), threading.Event()

    def launcher() -> None:
        with held_for_children():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=launcher)
    t.start()
    try:
        assert entered.wait(10)
        seen.append(held_now())  # the main thread, meanwhile
    finally:
        leave.set()
        t.join()
    assert seen == [frozenset()]


RANK = (
    "import os, signal, sys, time\n"
    "while signal.SIGUSR1 not in signal.sigpending(): time.sleep(0.01)\n"
    "got = []\n"
    "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
    "from checkpoint_layout.held_signals import release\n"
    "release()\n"
    "print('delivered' if got else 'lost', flush=True)\n"
)


def test_the_library_side_delivers_the_early_request_and_a_pending_one_exits_cleanly() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with held_for_children():
        rank = subprocess.Popen([sys.executable, "-c", RANK], env=env, stdout=subprocess.PIPE,
                                text=True)
        plain = subprocess.Popen([sys.executable, "-c",
                                  "import signal, time\n"
                                  "while not signal.sigpending(): time.sleep(0.01)\n"],
                                 env=env)
    for p in (rank, plain):
        p.send_signal(signal.SIGUSR1)
    out, _ = rank.communicate(timeout=30)
    assert (rank.returncode, out) == (0, "delivered\n")
    assert plain.wait(30) == 0  # never unblocked: ignored, and its exit is clean
