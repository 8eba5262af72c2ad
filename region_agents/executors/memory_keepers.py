"""The local executor's in-memory tier: one keeper process per (job, node), kept across
attempts, and the environment that points a job's ranks at them (docs/recovery.md).

Why in the executor and not in the attempt: a keeper must outlive the ranks (a recovery
restarts every rank) and the attempt (the relaunch is a new attempt), and die with its
node. Here, where "nodes" are simulated on one host, a keeper is a process per job and
node id; a lost node is simulated by killing its ranks and its keeper
(`kill_node`). A job asks for the tier with its trainer option `memory_every` (K > 0:
snapshot every K steps).

Lifetime: a job's keepers stop when one of its attempts succeeds, when the job is stopped
without a checkpoint-first (it is leaving), and at executor shutdown. A failed attempt
keeps them: its relaunch is what they are for. Memory: each keeper holds at most
`trainer.memkeeper.KEEP` snapshots of each rank it serves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from checkpoint_layout import job_options

log = logging.getLogger(__name__)

OPTION = "memory_every"  # TrainerSpec.options key
KEEP_OPTION = "memory_keep"  # TrainerSpec.options key: steps each keeper holds per rank
START_TIMEOUT_S = 30.0


def memory_every(options: Mapping[str, str]) -> int:
    """The job's snapshot interval K (0 = the tier is off), read through the one options
    table (checkpoint_layout/job_options.py; SubmitJob refused a bad value)."""
    return job_options.value(options, OPTION, strict=False)


def memory_keep(options: Mapping[str, str]) -> int:
    """Steps each of the job's keepers holds per rank (2 unless the job says), read
    through the one options table. Why a job may say 1: a large model's keepers then hold
    half the memory (the 200m model: 3 GB per copy instead of 6), at the cost that a node
    lost while a snapshot is half-sent leaves no step every rank holds, so that recovery
    uses the store."""
    return job_options.value(options, KEEP_OPTION, strict=False)


@dataclass
class _Keeper:
    proc: subprocess.Popen
    address: str


class KeeperPool:
    """Keepers by (job, node id), started on first use."""

    def __init__(self, work_dir: Path, python: str = sys.executable) -> None:
        self.work_dir, self.python = work_dir, python
        self._keepers: dict[tuple[str, str], _Keeper] = {}
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()

    def env_for(self, job_id: str, node_ids: list[str], every: int,
                keep: int | None = None) -> dict[str, str]:
        """The ranks' CB_MEMORY_* variables for this attempt's nodes, in node-rank order
        (a node seen for the first time, e.g. a spare, gets a new, empty keeper holding
        ``keep`` steps per rank; None: the keeper's default)."""
        from trainer.memkeeper import TOKEN_ENV
        from trainer.memtier import EVERY_ENV, KEEPERS_ENV

        with self._lock:
            token = self._tokens.setdefault(job_id, secrets.token_hex(16))
            addresses = [self._ensure(job_id, node, token, keep).address for node in node_ids]
        return {EVERY_ENV: str(every), KEEPERS_ENV: ",".join(addresses), TOKEN_ENV: token}

    def _ensure(self, job_id: str, node: str, token: str, keep: int | None = None) -> _Keeper:
        keeper = self._keepers.get((job_id, node))
        if keeper is not None and keeper.proc.poll() is None:
            return keeper
        from trainer.memkeeper import TOKEN_ENV

        d = self.work_dir / "memory-keepers" / job_id
        d.mkdir(parents=True, exist_ok=True)
        port_file = d / f"{node}.port"
        with contextlib.suppress(FileNotFoundError):
            port_file.unlink()
        repo = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, TOKEN_ENV: token,
               "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(d / f"{node}.log", "ab") as out:
            proc = subprocess.Popen(
                [self.python, "-m", "trainer.memkeeper", "--port-file", str(port_file),
                 *(["--keep", str(keep)] if keep else [])],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)  # a terminal's Ctrl-C to the agent spares it
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"memory keeper for {job_id} on {node} did not start "
                                   f"(see {d / (node + '.log')})")
            time.sleep(0.02)
        keeper = _Keeper(proc, f"127.0.0.1:{port_file.read_text().strip()}")
        self._keepers[(job_id, node)] = keeper
        log.info("memory keeper for %s on %s at %s", job_id, node, keeper.address)
        return keeper

    def kill_node(self, job_id: str, node: str) -> None:
        """Lose a node's memory (a fault campaign's node kill)."""
        with self._lock:
            keeper = self._keepers.pop((job_id, node), None)
        if keeper is not None:
            keeper.proc.kill()
            keeper.proc.wait()

    def stop_job(self, job_id: str) -> None:
        with self._lock:
            mine = [k for k in self._keepers if k[0] == job_id]
            keepers = [self._keepers.pop(k) for k in mine]
            self._tokens.pop(job_id, None)
        for keeper in keepers:
            keeper.proc.terminate()
        for keeper in keepers:
            try:
                keeper.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                keeper.proc.kill()
                keeper.proc.wait()

    def addresses(self, job_id: str) -> dict[str, str]:
        with self._lock:
            return {n: k.address for (j, n), k in self._keepers.items() if j == job_id}

    def shutdown(self) -> None:
        with self._lock:
            jobs = {j for j, _ in self._keepers}
        for job in jobs:
            self.stop_job(job)
