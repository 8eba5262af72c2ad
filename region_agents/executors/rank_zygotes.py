"""The agent's warm rank starters: one per node of a job (trainer/warm_start.py).

Why: a relaunch's ranks spent most of a recovery starting the interpreter and
importing torch (docs/recovery.md "Where a recovery's time goes"). A starter per
(job, node) holds those imports and forks the node's ranks of the job's next attempt.
Started once an attempt of the job *runs* (so its imports never compete with the
ranks' own start), kept across attempts like the memory keepers, stopped with the job.

Everything here falls back to an ordinary spawn: no starter on the node yet (a spare
that just joined, one still importing), one that died, or one that does not answer
within ``FORK_TIMEOUT_S``. A forked rank is not the agent's child; the executor
watches it as it watches a re-adopted rank (its pid and start time; its exit code
from the file the starter writes), and releases it only after the attempt record
holds its pid (the "go" pipe: :meth:`Forked.go`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORK_TIMEOUT_S = 10.0
WARM_OPTION = "warm_ranks"  # TrainerSpec.options: "0" = always spawn (docs/recovery.md)
MODULE = "trainer.warm_start"
# Per attempt or per rank: a starter serves every attempt, so it starts without them
# (and its children get the rank's whole environment with the fork request).
PER_ATTEMPT = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
               "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
KEEP_CB = ("CB_JOB_ID", "CB_NODE_ID")  # so a node's processes of a job can be found


def warm_command(argv: list[str], python: str) -> bool:
    """Whether ``argv`` is a Python program a starter can run (``python file.py ...``
    or ``python -m module ...`` with the agent's interpreter)."""
    if len(argv) < 2 or os.path.realpath(argv[0]) != os.path.realpath(python):
        return False
    return (argv[1] == "-m" and len(argv) >= 3) or (argv[1].endswith(".py") and not argv[1].startswith("-"))


def starter_env(env: Mapping[str, str], node_id: str) -> dict[str, str]:
    """A rank's environment without what belongs to one attempt or rank."""
    out = {k: v for k, v in env.items()
           if k not in PER_ATTEMPT and (not k.startswith("CB_") or k in KEEP_CB)}
    out["CB_NODE_ID"] = node_id
    return out


@dataclass
class _Starter:
    proc: subprocess.Popen
    sock: socket.socket
    ready: bool = False


@dataclass
class Forked:
    """A rank the starter forked, held before its first instruction until :meth:`go`."""

    pid: int
    go_fd: int
    starter: subprocess.Popen | None = None  # the starter that forked it (and reaps it)

    def starter_alive(self) -> bool:
        """Its starter still runs, so it will write the rank's exit status when the rank
        ends; a dead one (lost with its node) never will."""
        return self.starter is not None and self.starter.poll() is None

    def go(self) -> None:
        """Let the rank run (its pid is durable in the attempt record now)."""
        try:
            os.write(self.go_fd, b"g")
        finally:
            os.close(self.go_fd)

    def cancel(self) -> None:
        """Never run it: it exits at once (the pipe closes with nothing written)."""
        with contextlib.suppress(OSError):
            os.close(self.go_fd)


class RankZygotes:
    """The agent's starters, by (job, node)."""

    def __init__(self, work_dir: Path, python: str) -> None:
        self.work_dir = work_dir
        self.python = python
        self._lock = threading.Lock()
        self._starters: dict[tuple[str, str], _Starter] = {}

    def start(self, job_id: str, node_id: str, env: Mapping[str, str], cwd: str,
              popen_kwargs: Mapping[str, Any]) -> None:
        """Start the job's starter on ``node_id`` unless one lives (does not wait for
        its imports: until it says ready, launches spawn as before)."""
        with self._lock:
            old = self._starters.get((job_id, node_id))
            if old is not None and old.proc.poll() is None:
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            d = self.work_dir / "rank-starters" / job_id
            d.mkdir(parents=True, exist_ok=True)
            try:
                with open(d / f"{node_id}.log", "ab") as out:
                    proc = subprocess.Popen(
                        [self.python, "-m", MODULE, "--fd", str(theirs.fileno())],
                        env=starter_env(env, node_id), cwd=cwd, stdin=subprocess.DEVNULL,
                        stdout=out, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                        # its own group (a terminal's Ctrl-C to the agent spares it), in the
                        # agent's session: its ranks join their attempt's process group
                        process_group=0, **popen_kwargs)
            except OSError as e:
                ours.close()
                log.warning("%s: no warm rank starter on %s: %s", job_id, node_id, e)
                return
            finally:
                theirs.close()
            ours.setblocking(False)
            self._starters[(job_id, node_id)] = _Starter(proc, ours)
            log.info("%s: warm rank starter on %s (pid %d)", job_id, node_id, proc.pid)

    def ready(self, job_id: str, node_id: str) -> bool:
        """Its imports are done and it lives."""
        with self._lock:
            s = self._starters.get((job_id, node_id))
            if s is None or s.proc.poll() is not None:
                return False
            if not s.ready:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    s.ready = s.sock.recv(4096) != b""
            return s.ready

    def fork(self, job_id: str, node_id: str, *, argv: list[str], env: Mapping[str, str],
             cwd: str, pgid: int, exit_file: str, stdout_fd: int, stderr_fd: int) -> Forked | None:
        """A rank forked by the node's starter (held until :meth:`Forked.go`), or None:
        spawn it as usual (no ready starter, or it failed; a failed one is stopped)."""
        if not self.ready(job_id, node_id):
            return None
        with self._lock:
            s = self._starters[(job_id, node_id)]
            go_r, go_w = os.pipe()
            req = json.dumps({"argv": argv, "env": dict(env), "cwd": cwd, "pgid": pgid,
                              "exit_file": exit_file}).encode()
            try:
                s.sock.setblocking(True)
                s.sock.settimeout(FORK_TIMEOUT_S)
                socket.send_fds(s.sock, [req], [stdout_fd, stderr_fd, go_r])
                reply = json.loads(s.sock.recv(4096) or b"{}")
                pid = int(reply["pid"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                os.close(go_w)
                log.warning("%s: warm rank starter on %s failed (%s): spawning", job_id, node_id, e)
                self._stop(self._starters.pop((job_id, node_id)))
                return None
            finally:
                os.close(go_r)
                with contextlib.suppress(OSError):
                    s.sock.setblocking(False)
        return Forked(pid, go_w, s.proc)

    def nodes(self, job_id: str) -> list[str]:
        with self._lock:
            return [n for (j, n), s in self._starters.items() if j == job_id and s.proc.poll() is None]

    @staticmethod
    def _stop(s: _Starter) -> None:
        """Stop a starter now: it holds nothing worth a wait (a starter still importing
        would not read its socket's EOF for minutes), and SIGKILL reaches only the
        starter, not the ranks it forked (their own process groups)."""
        s.sock.close()
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait()

    def kill_node(self, job_id: str, node_id: str) -> None:
        with self._lock:
            s = self._starters.pop((job_id, node_id), None)
        if s is not None:
            self._stop(s)

    def stop_job(self, job_id: str) -> None:
        with self._lock:
            mine = [self._starters.pop(k) for k in list(self._starters) if k[0] == job_id]
        for s in mine:
            self._stop(s)
        if mine:
            log.info("%s: %d warm rank starter(s) stopped", job_id, len(mine))

    def shutdown(self) -> None:
        with self._lock:
            jobs = {j for j, _ in self._starters}
        for job in jobs:
            self.stop_job(job)


def wait_ready(z: RankZygotes, job_id: str, node_id: str, timeout: float) -> bool:
    """Poll until the starter is ready (tests and the benchmark)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if z.ready(job_id, node_id):
            return True
        time.sleep(0.05)
    return False
