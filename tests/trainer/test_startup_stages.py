"""A rank's start stages (trainer/startup.py): the ranks' half of a recovery's breakdown.

The process's start comes from /proc (so the interpreter's own start counts), each
stage is kept at its first mark, the summary reads as the time from one stage to the
next, and the agent forwards the progress file's ``startup`` as Progress.startup
(ignoring what is not a plausible time).
"""

from __future__ import annotations

import subprocess
import sys
import time

from region_agents.progress import parse_progress
from trainer import startup
from trainer.startup import Stage


def test_process_start_is_the_kernels_and_precedes_any_python() -> None:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.3); from trainer "
                          "import startup; print(time.time() - startup.process_start_time())"],
                         capture_output=True, text=True, timeout=120, check=True)
    age = float(out.stdout)
    assert 0.3 <= age <= time.time() - t0 + 0.05, age  # the sleep counts, nothing before the spawn
    assert startup.process_start_time(2**22 + 12345) is None  # no such process


def test_marks_keep_the_first_time_and_summarize_in_order(monkeypatch) -> None:
    monkeypatch.setattr(startup, "_times", {})
    startup.mark(Stage.IMPORTED, when=100.0)
    # the first mark adds this process's start (the pytest process: long before now)
    assert startup.times()[Stage.SPAWNED.value] == startup.process_start_time() or \
        abs(startup.times()[Stage.SPAWNED.value] - startup.process_start_time()) < 0.05
    startup.mark(Stage.PROCESS_GROUP, when=101.5)
    startup.mark(Stage.PROCESS_GROUP, when=999.0)  # a retry keeps the first
    startup.mark(Stage.RESTORED, when=104.0)
    assert startup.reached(Stage.RESTORED) and not startup.reached(Stage.FIRST_STEP)
    stages = {k: v for k, v in startup.times().items() if k != Stage.SPAWNED.value}
    assert startup.summary(stages) == "process group 1.50s, restored 2.50s"


def test_the_agent_forwards_plausible_stage_times_only() -> None:
    snap = parse_progress({"step": 3, "startup": {"spawned": 10.0, "imported": 12.5,
                                                  "bad": "x", "flag": True, "neg": -1}})
    assert snap is not None
    assert dict(snap.progress.startup) == {"spawned": 10.0, "imported": 12.5}
