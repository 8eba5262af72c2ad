"""When this rank's start reached each stage: the trainer's half of a recovery's breakdown.

Why: "recover in seconds" is a sum of stages in different processes (the agent notices
the dead rank, the broker decides and relaunches, the ranks start, import torch, meet in
the process group, restore, take a step). The agent and the broker time their own
stages; only the rank knows when its interpreter started, when its imports were done
and when it met its peers. Rank 0 writes these wall-clock times into the progress file
(``startup``: stage -> epoch seconds) once its first step is done, the agent forwards
them (``Progress.startup``) and the benchmark (benchmarks/bench_memtier.py) and the
job's view put them next to the broker's events. No cost on the step path: one dict
write per stage, once per process.
"""

from __future__ import annotations

import enum
import os
import time


class Stage(enum.StrEnum):
    """A rank's start, in order. ``spawned`` is the kernel's start time of the process
    (so interpreter start-up counts, which no line of Python can time itself)."""

    SPAWNED = "spawned"
    IMPORTED = "imported"  # init() called: interpreter, torch and the script's imports done
    PROCESS_GROUP = "process_group"  # the rendezvous, the mesh and the checkpoint group
    RESUMING = "resuming"  # the script built its model, optimizer, checkpointer: resume()
    RESTORED = "restored"  # the state is loaded (memory or store) and agreed
    FIRST_STEP = "first_step"  # the first step of this attempt is done


_times: dict[str, float] = {}


def process_start_time(pid: int | str = "self") -> float | None:
    """Wall-clock start of ``pid`` from /proc (Linux), None where that is not readable:
    now minus its age (the kernel's uptime minus its start in clock ticks since boot),
    so precise to a tick (10 ms), unlike /proc/stat's whole-second boot time."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        now = time.time()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime
        return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def mark(stage: Stage, when: float | None = None) -> None:
    """Record ``stage`` (the first time only: a retried resume keeps its first mark
    of the stages before it)."""
    if stage.value not in _times:
        if stage is Stage.IMPORTED and Stage.SPAWNED.value not in _times:
            start = process_start_time()
            if start is not None:
                _times[Stage.SPAWNED.value] = start
        _times[stage.value] = time.time() if when is None else when


def reached(stage: Stage) -> bool:
    return stage.value in _times


def times() -> dict[str, float]:
    """Stage -> epoch seconds, the stages reached so far."""
    return dict(_times)


def summary(stages: dict[str, float]) -> str:
    """``imported 3.1s, process group 0.4s, ...``: the time from each stage to the next."""
    order = [s.value for s in Stage if s.value in stages]
    parts = [f"{b.replace('_', ' ')} {stages[b] - stages[a]:.2f}s"
             for a, b in zip(order, order[1:], strict=False)]
    return ", ".join(parts)
