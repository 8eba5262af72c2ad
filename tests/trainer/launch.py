"""Start `python -m trainer` (or a script using the library) ranks as real subprocesses,
the way the region agent does.

One process per rank with torchrun-style env (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus the CB_* contract variables.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkpoint_layout.held_signals import held_for_children

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_spec(**over: Any) -> dict[str, Any]:
    """The TrainerSpec used by the equivalence tests (shared so runs are comparable)."""
    spec: dict[str, Any] = {
        "total_steps": 40,
        "checkpoint_every": 10,
        "global_batch_size": 16,
        "seed": 7,
        "model": "tiny",
        "step_sleep_s": 0.0,
        "options": {"micro_batch_size": "4", "keep_last": "10", "heartbeat_s": "0.5"},
    }
    opts = over.pop("options", {})
    spec.update(over)
    spec["options"] = {**spec["options"], **{k: str(v) for k, v in opts.items()}}
    return spec


@dataclass
class Run:
    procs: list[subprocess.Popen]
    workdir: Path
    progress_file: Path
    logs: list[Path] = field(default_factory=list)

    def wait(self, timeout: float = 240) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"ranks did not finish in {timeout}s:\n{self.output()}") from None
        return codes

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def signal(self, sig: int = signal.SIGTERM) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(sig)

    def output(self, rank: int | None = None) -> str:
        ranks = range(len(self.logs)) if rank is None else [rank]
        return "\n".join(f"--- rank {r}\n" + self.logs[r].read_text() for r in ranks)

    def stderr(self, rank: int = 0) -> str:
        return self.logs[rank].with_suffix(".err").read_text()

    def progress(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.progress_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None


def launch(
    workdir: Path,
    world_size: int,
    spec: dict[str, Any] | str,
    checkpoint_uri: str,
    *,
    env: dict[str, str] | None = None,
    resume_from: str = "",
    attempt: int = 0,
    job_id: str = "j-test",
    grace_s: float = 60,
    argv: list[str] | None = None,
    master_port: int = 0,
    rank_env: dict[int, dict[str, str]] | None = None,
) -> Run:
    """`argv` (default `-m trainer`): what each rank runs after the interpreter, e.g. an
    example script using the library; CB_TRAINER_CONFIG is then simply ignored.
    `rank_env`: extra variables for single ranks, by rank."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = master_port or free_port()
    progress = workdir / "progress.json"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CB_", "AWS_"))}
    base.update(env or {})
    base["PYTHONPATH"] = str(REPO)
    procs, logs = [], []
    for rank in range(world_size):
        e = dict(base)
        e.update(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(world_size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CB_JOB_ID=job_id,
            CB_ATTEMPT=str(attempt),
            CB_CHECKPOINT_URI=checkpoint_uri,
            CB_RESUME_FROM=resume_from,
            CB_TRAINER_CONFIG=spec if isinstance(spec, str) else json.dumps(spec),
            CB_PROGRESS_FILE=str(progress),
            CB_GRACE_S=str(grace_s),
            OMP_NUM_THREADS="1",
        )
        e.update((rank_env or {}).get(rank, {}))  # e.g. NODE_RANK for a multi-node layout
        out = workdir / f"rank{rank}.log"
        logs.append(out)
        with held_for_children():  # SIGUSR1 blocked until the library's handler is in, as
            procs.append(  # every launcher of ranks does (docs/contracts.md section 1)
                subprocess.Popen(
                    [sys.executable, *(argv or ["-m", "trainer"])],
                    env=e,
                    cwd=REPO,
                    stdout=open(out, "w"),  # noqa: SIM115 - closed when the process exits
                    stderr=open(out.with_suffix(".err"), "w"),  # noqa: SIM115
                )
            )
    return Run(procs, workdir, progress, logs)


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_clean(run: Any) -> None:
    """No rank died in a traceback or in gloo ("Connection closed by peer"): what a store
    outage the ranks did not agree on looks like."""
    for rank in range(len(run.procs)):
        err = run.stderr(rank)
        assert "Traceback" not in err, f"rank {rank}:\n{err}"
        assert "Connection closed by peer" not in err, f"rank {rank}:\n{err}"


def reference_run(s3: Any, work: Path, spec_for: Callable[[Path], dict[str, Any]],
                  steps: int) -> dict[str, Any]:
    """The uninterrupted run on 2 ranks in its own bucket, that a faulted run is compared
    with: {"bucket", "log" (its per-step records), "work"}."""
    bucket = s3.unique_bucket(work.name[:20])
    log = work / "ref.jsonl"
    run = launch(work / "ref", 2, spec_for(log), f"s3://{bucket}/ref", env=s3.env)
    codes = run.wait(300)
    assert codes == [0, 0], f"{codes}\n{run.output()}\n{run.stderr(0)}\n{run.stderr(1)}"
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    return {"bucket": bucket, "log": records, "work": work}
