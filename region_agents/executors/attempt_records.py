"""Durable per-attempt records of the local executor (issue 15 defect 2).

Why: the ranks of an attempt outlive the agent daemon (they lead their own process
group). An agent that kept its attempts only in memory came back after a crash with
``running 0``; the broker then failed the attempt over and launched the next one while
the old process group trained on: two attempts of one job writing at once. So each
attempt leaves a small JSON record beside its directory (``<work_dir>/jobs/<job>/
attempt-<n>.json``: in the agent's own ``jobs/<job>``, not in the attempt directory the
job owns, where a job could forge the pids a restarted root agent kills), written before
the ranks start and again once they run:

* the job, attempt and Launch (to rebuild the attempt and report it in Register),
* the process group id and each rank's pid **with its start time** from
  ``/proc/<pid>/stat`` (a pid recycled by an unrelated process is never mistaken for
  a rank: same pid + same start time = same process),
* a digest of the launch environment (what the ranks were started with),
* once finished: the terminal outcome, and whether the broker acknowledged it.

A restarted agent reads every record: live ranks are re-adopted (watched again, kept or
killed as the broker decides), finished-but-unacknowledged outcomes are re-sent, and
the attempt numbers seen keep fencing stale Launches.

The fence file (docs/contracts.md section 1, ``CB_FENCE_FILE``): when the agent
supersedes an attempt it creates ``superseded`` in that attempt's directory before
killing it; the trainer checks it right before committing a checkpoint manifest, so
an attempt that could not be killed in time still never commits a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_layout.nofollow import touch

RECORD_SUFFIX = ".json"
FENCE_NAME = "superseded"


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or
    None if there is no such live process (gone, or a zombie: it can write nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(")") + 2:].split()
    if len(rest) < 20 or rest[0] in ("Z", "X"):
        return None
    try:
        return int(rest[19])
    except ValueError:
        return None


def same_process_alive(pid: int, start_ticks: int) -> bool:
    """True if ``pid`` is alive *and* is the process started at ``start_ticks``."""
    return pid > 0 and start_ticks > 0 and proc_start_ticks(pid) == start_ticks


def env_digest(env: Mapping[str, str]) -> str:
    """sha256 of the launch environment's CB_* / rendezvous keys (what the ranks got)."""
    keys = sorted(k for k in env if k.startswith("CB_") or k in ("WORLD_SIZE", "MASTER_PORT"))
    h = hashlib.sha256()
    for k in keys:
        h.update(f"{k}={env[k]}\0".encode())
    return h.hexdigest()


@dataclass
class RankRecord:
    rank: int
    node_id: str
    pid: int
    start_ticks: int


@dataclass
class AttemptRecord:
    """One attempt as the agent last knew it (see the module docstring)."""

    job_id: str
    attempt: int
    dir: str
    launch_b64: str = ""  # base64 of the agent_pb2.Launch it was started from
    pgid: int = 0
    ranks: list[RankRecord] = field(default_factory=list)
    env_digest: str = ""
    hang_timeout_s: float = 0.0
    started: float = 0.0
    final: dict[str, Any] | None = None  # {state, exit_code, message, failed_nodes}
    acked: bool = False

    @property
    def path(self) -> Path:
        return record_path(self.dir)

    def save(self) -> None:
        """Atomic replace + fsync: a crash leaves the old or the new record, never half."""
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, path: Path) -> AttemptRecord | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            data["ranks"] = [RankRecord(**r) for r in data.get("ranks", [])]
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None

    def live_pids(self) -> list[int]:
        """Ranks still running (pid and start time both match)."""
        return [r.pid for r in self.ranks if same_process_alive(r.pid, r.start_ticks)]


def record_path(attempt_dir: str | Path) -> Path:
    """``jobs/<job>/attempt-<n>.json``: next to the attempt directory, in the agent's dir."""
    d = Path(attempt_dir)
    return d.with_name(d.name + RECORD_SUFFIX)


def scan(work_dir: Path, job_id: str = "*") -> list[AttemptRecord]:
    """Every attempt record under ``work_dir`` (of one job if given), oldest attempt
    first per job."""
    out = [rec for p in sorted(work_dir.glob(f"jobs/{job_id}/attempt-*{RECORD_SUFFIX}"))
           if (rec := AttemptRecord.load(p)) is not None]
    return sorted(out, key=lambda r: (r.job_id, r.attempt))


def orphan_pids(dirs: Iterable[str]) -> dict[str, list[int]]:
    """Live processes whose ``CB_WORK_DIR`` is one of ``dirs`` (ranks spawned before
    their record got their pids, e.g. the agent died mid-launch)."""
    want = {f"CB_WORK_DIR={d}".encode(): d for d in dirs}
    found: dict[str, list[int]] = {}
    if not want:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            d = want.get(item)
            if d is not None and proc_start_ticks(int(entry.name)) is not None:
                found.setdefault(d, []).append(int(entry.name))
    return found


def write_fence(attempt_dir: str | Path) -> None:
    """Mark an attempt superseded (the trainer refuses to commit checkpoints after)."""
    with contextlib.suppress(OSError):
        touch(Path(attempt_dir, FENCE_NAME))  # the job owns the dir: never through a link


def kill_and_wait(rec: AttemptRecord, extra_pids: Iterable[int] = (), timeout_s: float = 30.0,
                  ) -> bool:
    """Fence, SIGKILL the attempt's process group and ranks, and wait until none is
    alive. True if they are all gone (a process stuck in the kernel may outlive us)."""
    write_fence(rec.dir)
    extra = list(extra_pids)
    deadline = time.monotonic() + timeout_s
    while True:
        live = rec.live_pids() + [p for p in extra if proc_start_ticks(p) is not None]
        if not live:
            return True
        if rec.pgid > 0 and any(r.pid == rec.pgid for r in rec.ranks if r.pid in live):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rec.pgid, signal.SIGKILL)
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
