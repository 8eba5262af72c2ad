"""Local executor: runs each rank as a real process on this machine (torchrun-style).

Why real processes: the simulated cluster must behave like a real one where it
matters to the broker: gang failure, signals, exit codes, hangs. One attempt =
one process group (rank 0 leads a new group, the others join it), so a single ``killpg`` reaches every rank and anything they spawned.

Rank layout: ``nodes x min(gpus_per_node, ranks_per_node)`` processes, with
WORLD_SIZE set to that number (docs/contracts.md section 6, rule 8); the trainer keeps the global
batch fixed, so fewer ranks change speed, not results.

Restart safety (issue 15; records in attempt_records.py): every attempt leaves a durable
record, a restarted agent re-adopts or reports what a previous agent process started,
and no attempt starts while an older attempt of its job can still write. Why this
module is over 400 lines: recovery rebuilds the same private per-attempt state
(_Attempt/_Rank) the launch path builds, and the gang/stop logic must treat own and
re-adopted ranks alike; the JSON record format and /proc handling live apart.
"""

from __future__ import annotations

import base64
import contextlib
import glob
import logging
import os
import random
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from checkpoint_layout import job_options
from checkpoint_layout.crash_blame import culprit
from checkpoint_layout.held_signals import held_for_children
from checkpoint_layout.nofollow import read_small
from checkpoint_layout.standby_go import GO_ENV, GO_NAME, Go, GoAction, write_go
from checkpoint_layout.stop_deadline import (
    STOP_DEADLINE_ENV,
    STOP_DEADLINE_NAME,
    StopDeadline,
    write_stop_deadline,
)
from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors import attempt_records as records
from region_agents.executors.base import (
    AS,
    EXIT_CHECKPOINTED,
    EXIT_OK,
    NOT_THE_NODE,
    AttemptEvent,
    AttemptSpec,
    Executor,
    RunningInfo,
    trainer_config_json,
)
from region_agents.executors.job_dirs import JobDirError, make_job_dir, open_job_dir
from region_agents.executors.job_user import IdentityPool, JobUser, proc_tools
from region_agents.executors.memory_keepers import KeeperPool, memory_every, memory_keep
from region_agents.executors.rank_threads import rank_thread_env
from region_agents.executors.rank_zygotes import WARM_OPTION, Forked, RankZygotes, warm_command
from region_agents.logship import LogSource
from region_agents.progress import ProgressSnapshot, read_progress
from region_agents.resume_views import (
    OwnerBook,
    drop_stale_views,
    drop_view,
    inside,
    own_prefix,
    resolved,
    resume_point,
    view_dir,
)
from region_agents.workdir import unpack

log = logging.getLogger(__name__)

REPO_ROOT = str(Path(__file__).resolve().parents[2])
BARE_PYTHONS = frozenset({"python", "python3"})  # run as the agent's interpreter
STDERR_TAIL_LINES = 20
# A command that never writes CB_PROGRESS_FILE (a plain script, no progress contract) is
# reported RUNNING this long after spawn, marked as assumed (docs/contracts.md section 2).
# Per job: trainer option ``startup_timeout_s`` (0: the command has the progress contract,
# never assume). The built-in trainer (no command) always writes the file, so it is
# RUNNING only when the file says so.
ASSUMED_RUNNING = "no progress file after {s:g} s: assumed running (no progress contract)"


_PORTS_LOW = 20000  # rendezvous ports come from [_PORTS_LOW, the ephemeral range's start)
_HANDED: dict[int, float] = {}  # port -> when handed out (not again for _HANDED_S)
_HANDED_S = 120.0
_HANDED_LOCK = threading.Lock()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1, for an attempt's MASTER_PORT.

    Why not port 0: the kernel hands port 0 binds out of the ephemeral range, which is
    also where every outgoing connection (boto3 to S3, gRPC to the broker) takes its
    local port, so the port could be taken between this check and rank 0's listen; the
    fault campaign once saw exactly that (EADDRINUSE, a failed attempt). A random free
    port below the ephemeral range is never an outgoing connection's, and a port handed
    out lately is not handed out again while its attempt may still be starting."""
    high = _ephemeral_low()
    rng = random.SystemRandom()
    if high - _PORTS_LOW >= 1000:
        now = time.monotonic()
        with _HANDED_LOCK:
            for p, t in list(_HANDED.items()):
                if now - t > _HANDED_S:
                    del _HANDED[p]
            for _ in range(64):
                port = rng.randrange(_PORTS_LOW, high)
                if port in _HANDED:
                    continue
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    try:
                        s.bind(("127.0.0.1", port))
                    except OSError:
                        continue
                _HANDED[port] = now
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below: the kernel's
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    """The last lines of a log file (the message of a FAILED update)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(deque(data.splitlines(), maxlen=lines)).strip()


def file_path(uri: str) -> str:
    """``file:///x`` -> ``/x``; other URIs (``s3://``, plain paths) unchanged."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


@dataclass
class _Rank:
    rank: int
    node_id: str
    proc: subprocess.Popen | None  # None: re-adopted after an agent restart (not our child)
    stderr_path: Path
    returncode: int | None = None
    pid: int = 0
    start_ticks: int = 0
    forked: bool = False  # started by a warm starter (rank_zygotes.py): not our child
    gone_since: float = 0.0
    # a forked rank's starter still runs (None: unknown, e.g. re-adopted after a restart)
    starter_alive: Callable[[], bool] | None = None

    @property
    def exit_path(self) -> Path:
        """``CB_EXIT_FILE``: where the trainer writes its exit code as it exits."""
        return self.stderr_path.with_suffix(".exit")

    def poll(self) -> int | None:
        """Exit code, or None while running. An adopted rank is not our child, so its
        status is lost to us: the code it wrote to ``CB_EXIT_FILE`` stands for it
        (trainer.errors.record_exit), else ``ADOPTED_EXITED`` (unknown)."""
        if self.returncode is None:
            if self.proc is not None:
                self.returncode = self.proc.poll()
            elif not records.same_process_alive(self.pid, self.start_ticks):
                code = _written_exit_code(self.exit_path)
                if code == ADOPTED_EXITED and self.forked and self._starter_may_write():
                    return None  # its starter writes the status as it reaps it
                self.returncode = code
        return self.returncode

    def _starter_may_write(self) -> bool:
        """A forked rank's starter writes its exit status within moments of its end
        (trainer/warm_start.py reaps every 20 ms): wait that long, not forever, and not
        at all when the starter is dead too (a lost node takes both: nothing will write
        it, and the wait only delays the recovery)."""
        if self.starter_alive is not None and not self.starter_alive():
            return False
        now = time.monotonic()
        self.gone_since = self.gone_since or now
        return now - self.gone_since < STARTER_EXIT_WAIT_S


    def signal(self, sig: int) -> None:
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self.proc is not None:
                self.proc.send_signal(sig)
            else:
                os.kill(self.pid, sig)


STARTER_EXIT_WAIT_S = 2.0
ADOPTED_EXITED = -1000  # exit code of a re-adopted rank that has exited (see _Rank.poll)


def _written_exit_code(path: Path) -> int:
    """What a re-adopted rank wrote to ``CB_EXIT_FILE``, or ``ADOPTED_EXITED`` (unknown)."""
    got = read_small(path, 64)  # the job's file: no link or FIFO is opened
    try:
        return int(got[0].split()[0]) if got is not None else ADOPTED_EXITED
    except (ValueError, IndexError):
        return ADOPTED_EXITED


def _open_log(path: Path) -> BinaryIO:
    """A rank's stdout/stderr file in the job-owned attempt dir, opened by the (root)
    agent for appending: never through a planted link, never a FIFO or device."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                 | os.O_CLOEXEC, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "ab")


@dataclass
class _Attempt:
    spec: AttemptSpec
    dir: Path
    progress_path: Path
    pgid: int
    ranks: list[_Rank]
    started: float
    state: int = AS.ATTEMPT_STATE_STARTING
    stop_mode: str = ""  # "" | "checkpoint" | "kill"
    kill_deadline: float | None = None
    killed_by_us: bool = False
    failure: tuple[int, str, list[str]] | None = None  # exit code, message, failed nodes
    last: ProgressSnapshot | None = None
    last_sent_sig: tuple | None = None
    last_sent_time: float = 0.0
    hang_timeout_s: float = 0.0
    events: list[AttemptEvent] = field(default_factory=list)
    record: records.AttemptRecord | None = None
    view_dropped: bool = False  # its copy of a shared checkpoint is gone (or never was)
    # (environment, cwd, identity) for the job's warm rank starters; None = none for it
    warm: tuple[dict[str, str], str, dict] | None = None
    warmed_up: bool = False  # its starters were asked for (once the trainer said running)

    @property
    def key(self) -> tuple[str, int]:
        return (self.spec.job_id, self.spec.attempt)


class LocalExecutor(Executor):
    """Runs attempts as local process groups; see the module docstring."""

    name = "local"

    def __init__(
        self,
        work_dir: str | os.PathLike[str],
        *,
        ranks_per_node: int = 2,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        hang_timeout_s: float = 600.0,
        starting_grace_s: float = 30.0,
        progress_interval_s: float = 1.0,
        default_checkpoint_root: str = "",
        job_user: JobUser | None = None,
        identities: IdentityPool | None = None,
        checkpoint_roots: list[str] | None = None,
        hide_proc: bool = True,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()  # ranks run elsewhere: no relative paths
        self.ranks_per_node = max(1, int(ranks_per_node))
        self.python = python
        self.extra_env = dict(extra_env or {})
        self.hang_timeout_s = hang_timeout_s
        self.starting_grace_s = starting_grace_s
        self.progress_interval_s = progress_interval_s
        self.default_checkpoint_root = default_checkpoint_root or str(self.work_dir / "checkpoints")
        # None: ranks run as the agent's user (policy: region_agents/executors/job_user.py).
        self.job_user = job_user
        # Per-job (or per-team) identities from a uid range (takes precedence over job_user).
        self.identities = identities
        # Trusted roots a job's checkpoint path is walked from (region_agents/executors/job_dirs.py).
        self.checkpoint_roots = [*(checkpoint_roots or []), self.default_checkpoint_root]
        # A private hidepid /proc per rank when ranks run as another identity and the
        # host allows it (job_user.proc_tools); None: ranks drop with Popen(user=...).
        self.proc_tools = proc_tools(python) if hide_proc and (job_user or identities) else None
        if (job_user or identities) and hide_proc and self.proc_tools is None:
            log.warning("ranks cannot get a private hidepid /proc here (no unshare/setpriv, or"
                        " the probe failed): mount the host's /proc with hidepid=invisible")
        # Which job made each checkpoint prefix on this host (region_agents/resume_views.py).
        self.owners = OwnerBook(self.work_dir / "checkpoint-owners.json")
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._pending: list[AttemptEvent] = []
        self._lock = threading.RLock()
        # The in-memory recovery tier's keepers (jobs with trainer option memory_every).
        self.keepers = KeeperPool(self.work_dir, python)
        # Warm rank starters per (job, node) for jobs with the memory tier (rank_zygotes.py)
        self.zygotes = RankZygotes(self.work_dir, python)

    # ---- launch ---------------------------------------------------------------
    def resolve_command(self, command: list[str]) -> list[str]:
        """The argv each rank runs: the built-in trainer when the job gives none, and a
        bare ``python``/``python3`` as the agent's own interpreter (``--python``).

        Why: ``run: python train.py`` means "the Python this agent runs ranks with", the
        one that has torch and the ``trainer`` library; a PATH lookup would find whatever
        interpreter comes first on the host (often a system Python without torch) and the
        job would die at ``import torch``. An absolute path is left alone.
        """
        if not command:
            return [self.python, "-m", "trainer"]
        if command[0] in BARE_PYTHONS:
            return [self.python, *command[1:]]
        return command

    def rank_path(self, path: str) -> str:
        """PATH for the ranks: the interpreter's directory first, as activating its venv
        would, so ``python`` inside a ``bash -c`` run script and the venv's console
        scripts (``torchrun``) are the agent's too."""
        bindir = os.path.dirname(self.python)
        if not bindir:
            return path
        rest = [p for p in path.split(os.pathsep) if p and p != bindir]
        return os.pathsep.join([bindir, *rest])

    def user_for(self, spec: AttemptSpec) -> JobUser | None:
        """The identity ``spec``'s ranks run as: its own (``job_uid_range``; its team's
        with ``job_identity: team``), the one ``run_as_user``, or None (the agent's own)."""
        if self.identities is not None:
            return self.identities.for_job(spec.job_id, spec.spec.team)
        return self.job_user

    def checkpoint_dir(self, spec: AttemptSpec) -> str:
        """The attempt's checkpoint location (an absolute path or a URI)."""
        ckpt = file_path(spec.checkpoint_uri or spec.spec.checkpoint_uri) or os.path.join(
            self.default_checkpoint_root, spec.job_id)
        return ckpt if "://" in ckpt else os.path.abspath(ckpt)

    def prepare(self, spec: AttemptSpec) -> None:
        """Make (or check) the attempt's local checkpoint directory for its identity before
        anything is copied into it; JobDirError (a ValueError) names what is refused."""
        ckpt = self.checkpoint_dir(spec)
        if "://" in ckpt:
            return
        user = self.user_for(spec)
        root = Path(self.default_checkpoint_root)
        if user is not None and root in Path(ckpt).parents:  # the agent's own root: no
            root.mkdir(parents=True, exist_ok=True)          # job lists the others' ids
            os.chmod(root, 0o711, follow_symlinks=False)
        make_job_dir(ckpt, self.checkpoint_roots, user)
        # by ownership, not by string: a second job of the same uid may not share the prefix
        self.owners.claim(resolved(own_prefix(ckpt), self.checkpoint_roots), spec.job_id)

    def source_user(self, spec: AttemptSpec) -> JobUser | None:
        """The identity whose files a shared checkpoint (``resume_source``) must be."""
        if self.identities is not None:
            src = spec.spec.resume_source
            return self.identities.for_job(src.job_id, src.team)
        return self.job_user

    def resume_point(self, spec: AttemptSpec, ckpt: str, user: JobUser | None) -> str:
        """CB_RESUME_FROM: its own checkpoint, or a read-only copy of a shared one
        (resume_views.resume_point); JobDirError names what is refused."""
        resume = file_path(spec.resume_from)
        if not resume:
            return ""
        view = view_dir(self.work_dir, spec.job_id, spec.attempt)
        return resume_point(job_id=spec.job_id, resume=resume, checkpoint_dir=ckpt,
                            source=spec.spec.resume_source, roots=self.checkpoint_roots,
                            user=user, source_user=self.source_user(spec),
                            book=self.owners, view_dir=view)

    def _attempt_dir(self, spec: AttemptSpec, user: JobUser | None) -> Path:
        """``jobs/<job>/attempt-<n>``: ``jobs`` and ``jobs/<job>`` are the agent's (0711:
        crossable, not listable, so no job learns other job ids), the attempt directory
        is the job identity's own (0700), made by fd and never through a link."""
        jobs = self.work_dir / "jobs" / spec.job_id
        fd = open_job_dir(str(jobs), [str(self.work_dir)], None)
        try:
            if user is not None:
                os.fchmod(fd, 0o711)
                with contextlib.suppress(OSError):
                    os.chmod(self.work_dir / "jobs", 0o711, follow_symlinks=False)
        finally:
            os.close(fd)
        adir = jobs / f"attempt-{spec.attempt}"
        os.close(open_job_dir(str(adir), [str(jobs)], user))
        return adir

    def layout(self, spec: AttemptSpec) -> list[tuple[str, int]]:
        """(node_id, ranks on it) per placed node."""
        nodes = list(spec.placement.nodes)
        gpn_default = spec.spec.resources.gpus_per_node or 1
        if not nodes:
            count = max(1, spec.spec.resources.nodes)
            nodes = [common_pb2.NodeAssignment(node_id=f"local-{i}") for i in range(count)]
        return [(n.node_id, max(1, min(n.gpus or gpn_default, self.ranks_per_node))) for n in nodes]

    def ranks(self, spec: AttemptSpec) -> int:
        return sum(n for _, n in self.layout(spec))

    def launch(self, spec: AttemptSpec) -> None:
        with self._lock:
            if spec.attempt <= 0:
                raise ValueError(f"attempt must be >= 1, got {spec.attempt}")
            layout = self.layout(spec)
            world = sum(n for _, n in layout)
            user = self.user_for(spec)
            # No attempt may take a step while an older one of the job can still write.
            self._fence_older(spec.job_id, spec.attempt)
            adir = self._attempt_dir(spec, user)
            with contextlib.suppress(FileNotFoundError):
                (adir / records.FENCE_NAME).unlink()
            progress_path = adir / "progress.json"
            for stale in (progress_path, adir / STOP_DEADLINE_NAME):
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
            ckpt = self.checkpoint_dir(spec)  # resolved here, not in each rank's cwd
            self.prepare(spec)  # its own identity's, by fd; what the agent copied in, too
            resume = self.resume_point(spec, ckpt, user)
            # Users' code: a fresh copy of the workdir per attempt (unpacked as the job's
            # identity), and the ranks' cwd.
            cwd = (unpack(spec.workdir_tar, adir / "workdir", user, self.python)
                   if spec.workdir_tar else adir)
            command = self.resolve_command(list(spec.spec.command))
            base_env = dict(os.environ)
            base_env.update(self.extra_env)
            base_env.update(dict(spec.spec.env))
            base_env.update(spec.env)
            base_env.update(rank_thread_env(base_env))  # torchrun's 1 thread unless set
            base_env["PATH"] = self.rank_path(base_env.get("PATH", ""))
            pythonpath = base_env.get("PYTHONPATH", "")
            base_env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + pythonpath if pythonpath else "")
            base_env.update(
                {
                    "WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(free_port()),
                    "CB_JOB_ID": spec.job_id,
                    "CB_ATTEMPT": str(spec.attempt),
                    "CB_CHECKPOINT_URI": ckpt,
                    "CB_RESUME_FROM": resume,
                    "CB_TRAINER_CONFIG": trainer_config_json(spec.spec.trainer),
                    "CB_PROGRESS_FILE": str(progress_path),
                    "CB_WORK_DIR": str(adir),
                    "CB_FENCE_FILE": str(adir / records.FENCE_NAME),
                    # the Stop's grace, written right before its SIGTERM (CB_GRACE_S is
                    # fixed now; a stop's deadline is known only when it comes)
                    STOP_DEADLINE_ENV: str(adir / STOP_DEADLINE_NAME),
                    "PYTHONUNBUFFERED": "1",
                }
            )
            base_env.setdefault("CB_GRACE_S", "120")
            every = memory_every(dict(spec.spec.trainer.options))
            if every:  # a keeper per node, kept across attempts (docs/recovery.md)
                try:
                    base_env.update(self.keepers.env_for(
                        spec.job_id, [n for n, _ in layout], every,
                        memory_keep(dict(spec.spec.trainer.options))))
                except (OSError, RuntimeError) as e:  # the store tier still works
                    log.warning("%s: memory tier off for this attempt: %s", spec.job_id, e)
            if spec.standby:  # make-before-break: no step before the Go writes this file
                with contextlib.suppress(FileNotFoundError):
                    (adir / GO_NAME).unlink()
                base_env[GO_ENV] = str(adir / GO_NAME)
            if user is not None:
                base_env.update(HOME=str(adir), USER=user.name, LOGNAME=user.name)
            drop = user.popen_kwargs() if user is not None and self.proc_tools is None else {}
            isolate = user if self.proc_tools is not None else None
            options = spec.spec.trainer.options  # one table: checkpoint_layout/job_options.py
            hang = job_options.value(options, "hang_timeout_s", self.hang_timeout_s, strict=False)
            ranks: list[_Rank] = []
            held: list[Forked] = []  # forked ranks, released once the record has their pids
            # a job with the memory tier recovers in place: its ranks start warm where
            # the node has a starter (opt out: trainer option warm_ranks=0)
            warm = (bool(every) and isolate is None and warm_command(command, self.python)
                    and job_options.value(options, WARM_OPTION, strict=False))
            pgid = 0
            rank = 0
            # Durable before the first spawn (an agent dying mid-launch leaves a record;
            # its ranks are then found by CB_WORK_DIR), completed with pids right after.
            record = records.AttemptRecord(
                job_id=spec.job_id, attempt=spec.attempt, dir=str(adir),
                launch_b64=base64.b64encode(_launch_of(spec).SerializeToString()).decode(),
                env_digest=records.env_digest(base_env), hang_timeout_s=hang,
                started=time.time())
            record.save()
            try:
                for node_rank, (node_id, local_world) in enumerate(layout):
                    for local in range(local_world):
                        env = dict(base_env)
                        env.update(
                            {
                                "RANK": str(rank),
                                "CB_EXIT_FILE": str(adir / f"rank-{rank}.exit"),
                                "LOCAL_RANK": str(local),
                                "LOCAL_WORLD_SIZE": str(local_world),
                                "GROUP_RANK": str(node_rank),
                                "NODE_RANK": str(node_rank),
                                "CB_NODE_ID": node_id,
                            }
                        )
                        # The job owns adir and its rank 0 already runs: no link followed.
                        out = _open_log(adir / f"rank-{rank}.stdout")
                        err_path = adir / f"rank-{rank}.stderr"
                        err = _open_log(err_path)
                        argv, env_fd = command, -1
                        if isolate is not None:  # root's steps see none of the job's env
                            argv, env, env_fd = isolate.isolated(command, env, self.proc_tools,
                                                                 self.python)
                        forked = self.zygotes.fork(
                            spec.job_id, node_id, argv=command, env=env, cwd=str(cwd),
                            pgid=pgid, exit_file=env["CB_EXIT_FILE"], stdout_fd=out.fileno(),
                            stderr_fd=err.fileno()) if warm else None
                        if forked is not None:
                            out.close()
                            err.close()
                            held.append(forked)
                            if rank == 0:
                                pgid = forked.pid
                            ticks = records.proc_start_ticks(forked.pid) or 0
                            ranks.append(_Rank(rank, node_id, None, err_path, pid=forked.pid,
                                               start_ticks=ticks, forked=True,
                                               starter_alive=forked.starter_alive))
                            rank += 1
                            continue
                        try:
                            # SIGUSR1 blocked in the rank until the trainer's handler is
                            # in (held_signals.py): an early checkpoint-now is not fatal
                            with held_for_children():
                                proc = subprocess.Popen(
                                    argv,
                                    env=env,
                                    pass_fds=(env_fd,) if env_fd >= 0 else (),
                                    cwd=cwd,
                                    stdin=subprocess.DEVNULL,
                                    stdout=out,
                                    stderr=err,
                                    # Rank 0 leads a new process group, the others join it. (Not a
                                    # new *session* per rank: setpgid cannot join a group in
                                    # another session.) A terminal's Ctrl-C to the agent's group
                                    # does not reach the ranks; one killpg reaches them all.
                                    process_group=0 if rank == 0 else pgid,
                                    **drop,  # type: ignore[arg-type]
                                )
                        finally:
                            out.close()
                            err.close()
                            if env_fd >= 0:
                                os.close(env_fd)
                        if rank == 0:
                            pgid = proc.pid
                        ticks = records.proc_start_ticks(proc.pid) or 0
                        ranks.append(_Rank(rank, node_id, proc, err_path, pid=proc.pid,
                                           start_ticks=ticks))
                        rank += 1
            except OSError as e:
                for f in held:
                    f.cancel()
                if pgid:
                    self._killpg(pgid, signal.SIGKILL)
                raise ValueError(f"cannot start {command[0]!r}: {e.strerror or e}") from None
            record.pgid = pgid
            record.ranks = [records.RankRecord(r.rank, r.node_id, r.pid, r.start_ticks)
                            for r in ranks]
            try:
                record.save()
            except BaseException:
                for f in held:
                    f.cancel()  # never run a rank the record does not hold
                raise
            for f in held:
                f.go()
            if held:
                log.info("%s attempt %d: %d of %d ranks started warm", spec.job_id,
                         spec.attempt, len(held), world)
            att = _Attempt(
                spec=spec,
                dir=adir,
                progress_path=progress_path,
                pgid=pgid,
                ranks=ranks,
                started=record.started,
                hang_timeout_s=hang,
                record=record,
                warm=(base_env, str(cwd), drop) if warm else None,
            )
            self._attempts[att.key] = att
            self._pending.append(AttemptEvent(spec.job_id, spec.attempt, AS.ATTEMPT_STATE_STARTING))
            log.info("launched %s attempt %d: %d ranks in %s", spec.job_id, spec.attempt, world, adir)

    # ---- control ----------------------------------------------------------------
    @staticmethod
    def _killpg(pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _signal_live(self, att: _Attempt, sig: int) -> None:
        """Signal each live rank directly and the group (the leader may be gone)."""
        live = False
        for r in att.ranks:
            if r.poll() is None:
                live = True
                r.signal(sig)
        if live:  # a group id stays ours while any member lives (Linux never reuses it)
            self._killpg(att.pgid, sig)

    def log_sources(self, job_id: str, attempt: int) -> list[LogSource]:
        """``rank-<r>.stdout`` / ``rank-<r>.stderr`` in the attempt directory."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return []
            return [LogSource(r.rank, stream, att.dir / f"rank-{r.rank}.{stream}")
                    for r in att.ranks for stream in ("stdout", "stderr")]

    def get(self, job_id: str, attempt: int) -> _Attempt | None:
        return self._attempts.get((job_id, attempt))

    supports_standby = True

    def go(self, job_id: str, attempt: int, go: Go) -> None:
        """Write the standby attempt's go file (trainer/standby.py waits for it)."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            if go.action is GoAction.GO and file_path(go.resume_from):
                # the same rule as a launch's resume point: its own, or a read-only copy
                # of the shared one it started from (resume_views.py)
                spec = replace(att.spec, resume_from=go.resume_from)
                try:
                    go = Go(go.action, self.resume_point(spec, self.checkpoint_dir(spec),
                                                         self.user_for(spec)), go.reason)
                except JobDirError as e:
                    write_go(att.dir / GO_NAME, Go(GoAction.ABORT, "", f"refused: {e}"))
                    raise
            write_go(att.dir / GO_NAME, go)

    def parked(self, job_id: str, attempt: int) -> bool | None:
        """The standby's own word in its progress file (read fresh: the ticker may lag)."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or all(r.poll() is not None for r in att.ranks):
                return None
            snap = read_progress(str(att.progress_path))
            return snap is not None and snap.state == "standby"

    def stop(self, job_id: str, attempt: int, checkpoint_first: bool, grace_s: float) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            if checkpoint_first:
                if att.stop_mode:
                    return  # already stopping; the first deadline stands
                att.stop_mode = "checkpoint"
                att.kill_deadline = time.time() + max(0.0, grace_s)
                try:  # before the SIGTERM: the trainer reads it when it acts on the signal
                    write_stop_deadline(att.dir / STOP_DEADLINE_NAME,
                                        StopDeadline(att.kill_deadline, max(0.0, grace_s)))
                except OSError as e:  # the trainer falls back to CB_GRACE_S
                    log.warning("%s attempt %d: cannot write the stop deadline: %s",
                                job_id, attempt, e)
                self._signal_live(att, signal.SIGTERM)
                self._set_state(att, AS.ATTEMPT_STATE_CHECKPOINTING)
            else:
                if not att.stop_mode or att.stop_mode == "checkpoint":
                    att.stop_mode = "kill"
                att.killed_by_us = True
                self._signal_live(att, signal.SIGKILL)

    def checkpoint(self, job_id: str, attempt: int) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                raise KeyError(f"{job_id} attempt {attempt} is not running here")
            self._signal_live(att, signal.SIGUSR1)

    def fail(self, job_id: str, attempt: int, message: str, failed_nodes: list[str]) -> None:
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or att.failure is not None:
                return
            att.failure = (-signal.SIGKILL, message, list(failed_nodes))
            att.killed_by_us = True
            self._signal_live(att, signal.SIGKILL)

    # ---- observation ------------------------------------------------------------------
    def _set_state(self, att: _Attempt, state: int, progress: common_pb2.Progress | None = None) -> None:
        if att.state == state:
            return
        att.state = state
        if progress is None and att.last is not None:
            progress = att.last.progress
        att.events.append(AttemptEvent(att.spec.job_id, att.spec.attempt, state, progress,
                                       store_wait=att.last.store_wait() if att.last else None))
        if progress is not None and att.last is not None:
            att.last_sent_sig = att.last.signature()
            att.last_sent_time = time.time()

    def poll(self) -> list[AttemptEvent]:
        with self._lock:
            now = time.time()
            out, self._pending = self._pending, []
            for key in list(self._attempts):
                att = self._attempts[key]
                self._poll_one(att, now)
                out.extend(att.events)
                att.events = []
                if att.state in (
                    AS.ATTEMPT_STATE_SUCCEEDED,
                    AS.ATTEMPT_STATE_FAILED,
                    AS.ATTEMPT_STATE_CHECKPOINTED,
                    AS.ATTEMPT_STATE_STOPPED,
                ):
                    del self._attempts[key]
            return out

    def _poll_one(self, att: _Attempt, now: float) -> None:
        snap = read_progress(str(att.progress_path))
        if snap is not None:
            att.last = snap
        for r in att.ranks:
            if r.poll() == ADOPTED_EXITED:
                r.returncode = self._adopted_exit_code(att)
        alive = [r for r in att.ranks if r.returncode is None]

        # Stop deadline passed: the trainer did not checkpoint in time.
        if alive and att.stop_mode == "checkpoint" and att.kill_deadline and now >= att.kill_deadline:
            att.killed_by_us = True
            self._signal_live(att, signal.SIGKILL)

        # Gang failure: one rank crashed -> the others cannot make progress.
        if att.failure is None and not att.stop_mode:
            crashed = [r for r in att.ranks if r.returncode not in (None, EXIT_OK, EXIT_CHECKPOINTED)]
            if crashed:
                # One poll may find several dead: the node that was lost (its ranks killed
                # by a signal) and peers that then failed their collective (an exit code).
                # Which one is blamed is the rule every executor shares (crash_blame.py).
                first = culprit(crashed, code=lambda r: r.returncode, order=lambda r: r.rank)
                blamed = [] if first.returncode in NOT_THE_NODE else [first.node_id]
                msg = f"rank {first.rank} on {first.node_id} exited with code {first.returncode}"
                stderr = tail(first.stderr_path)
                if stderr:
                    msg += ":\n" + stderr
                att.failure = (first.returncode, msg, blamed)
                if alive:
                    att.killed_by_us = True
                    self._signal_live(att, signal.SIGKILL)
            elif alive:
                beat = att.last.heartbeat if att.last else att.started
                if att.hang_timeout_s > 0 and now - beat > att.hang_timeout_s:
                    idle = int(now - beat)
                    att.failure = (-signal.SIGKILL, f"hang: no progress for {idle} s", [])
                    att.killed_by_us = True
                    self._signal_live(att, signal.SIGKILL)

        alive = [r for r in att.ranks if r.returncode is None]
        if alive:
            self._running_updates(att, now)
            return
        self._finish(att)

    def _running_updates(self, att: _Attempt, now: float) -> None:
        if att.stop_mode or att.failure:
            return
        snap = att.last
        if att.state == AS.ATTEMPT_STATE_STARTING:
            # RUNNING only when the trainer says so (issue 15 defect 5): a stop that
            # reaches a trainer still importing or resuming would save a state that is
            # not a real training state. ``starting`` in the file means not yet.
            if snap is not None and snap.state in ("running", "checkpointing", "done"):
                self._set_state(att, AS.ATTEMPT_STATE_RUNNING)
                self._warm_up(att)
                return
            if snap is not None and snap.store_wait() is not None:
                # still STARTING, but the ranks wait for their store: say so (and the
                # broker shows the job waiting at its durable step, not launching at 0)
                self._send_progress(att, snap, now)
                return
            timeout = self._startup_timeout(att)
            if snap is None and timeout is not None and now - att.started >= timeout:
                self._set_state(att, AS.ATTEMPT_STATE_RUNNING)
                if att.events and att.events[-1].state == AS.ATTEMPT_STATE_RUNNING:
                    att.events[-1].message = ASSUMED_RUNNING.format(s=timeout)
                log.info("%s attempt %d: %s", att.spec.job_id, att.spec.attempt,
                         ASSUMED_RUNNING.format(s=timeout))
            return
        if snap is None:
            return
        if snap.state == "running" and not att.warmed_up:  # also after an assumed RUNNING
            self._warm_up(att)
        if not att.view_dropped and self._own_checkpoint(att, snap.progress.last_checkpoint_uri):
            # the attempt saved a checkpoint of its own: every rank is past its start (a
            # save follows a step all ranks took), and every later launch resumes from
            # its own; the copy of what it started from is not needed any more
            self._drop_view(att)
        self._send_progress(att, snap, now)

    def _warm_up(self, att: _Attempt) -> None:
        """The attempt runs: start the job's warm rank starters for its next attempt on
        its nodes and on its pool's spares (Launch.spare_nodes: where a lost node's
        replacement would run), after the ranks' own start so that their imports do
        not compete with it."""
        att.warmed_up = True
        if att.warm is None:
            return
        env, cwd, drop = att.warm
        for node in dict.fromkeys([*(r.node_id for r in att.ranks), *att.spec.spare_nodes]):
            self.zygotes.start(att.spec.job_id, node, env, cwd, drop)

    def _send_progress(self, att: _Attempt, snap: ProgressSnapshot, now: float) -> None:
        """Report ``snap`` when it says something new, at most every progress_interval_s
        (a change of the ranks' store wait is news at once)."""
        sig = snap.signature()
        if sig == att.last_sent_sig:
            return
        waits = (att.last_sent_sig or ())[-1:] != sig[-1:]
        if not waits and now - att.last_sent_time < self.progress_interval_s:
            return
        att.last_sent_sig = sig
        att.last_sent_time = now
        att.events.append(AttemptEvent(att.spec.job_id, att.spec.attempt, att.state, snap.progress,
                                       store_wait=snap.store_wait()))

    def _own_checkpoint(self, att: _Attempt, uri: str) -> bool:
        path = file_path(uri)
        ckpt = self.checkpoint_dir(att.spec)
        if not uri:
            return False
        if "://" in ckpt or "://" in path:
            return uri.startswith(ckpt.rstrip("/") + "/")
        return inside(own_prefix(ckpt), os.path.abspath(path))

    def _drop_view(self, att: _Attempt) -> None:
        """Remove the attempt's copy of a shared checkpoint (resume_views.drop_view)."""
        att.view_dropped = True
        try:
            if drop_view(self.work_dir, att.spec.job_id, att.spec.attempt):
                log.info("%s attempt %d: removed its copy of a shared checkpoint",
                         att.spec.job_id, att.spec.attempt)
        except OSError as e:  # logged, retried at the agent's next start
            log.warning("%s attempt %d: could not remove its copy of a shared checkpoint: %s",
                        att.spec.job_id, att.spec.attempt, e)

    def _startup_timeout(self, att: _Attempt) -> float | None:
        """Seconds after which a silent attempt (no progress file) counts as RUNNING;
        None for the built-in trainer, which has the progress contract."""
        spec = att.spec.spec
        if not spec.command:
            return None
        timeout = job_options.value(spec.trainer.options, "startup_timeout_s",
                                    self.starting_grace_s, strict=False)
        return timeout if timeout > 0 else None

    def _finish(self, att: _Attempt) -> None:
        codes = [r.returncode for r in att.ranks]
        progress = att.last.progress if att.last else None
        failed_nodes: list[str] = []
        if att.failure is not None:
            state, (code, msg, failed_nodes) = AS.ATTEMPT_STATE_FAILED, att.failure
        elif att.stop_mode == "kill" or (att.stop_mode and att.killed_by_us):
            state, code = AS.ATTEMPT_STATE_STOPPED, -signal.SIGKILL
            msg = "killed on stop" if att.stop_mode == "kill" else "killed: no checkpoint within grace"
        elif all(c == EXIT_OK for c in codes):
            state, code, msg = AS.ATTEMPT_STATE_SUCCEEDED, EXIT_OK, "all ranks exited 0"
        elif all(c in (EXIT_OK, EXIT_CHECKPOINTED) for c in codes):
            state, code, msg = AS.ATTEMPT_STATE_CHECKPOINTED, EXIT_CHECKPOINTED, "checkpointed"
        else:
            bad = culprit((r for r in att.ranks if r.returncode not in (EXIT_OK, EXIT_CHECKPOINTED)),
                          code=lambda r: r.returncode, order=lambda r: r.rank)
            state, code = AS.ATTEMPT_STATE_FAILED, bad.returncode or 1
            msg = f"rank {bad.rank} exited with code {bad.returncode}\n" + tail(bad.stderr_path)
        att.state = state
        att.events.append(
            AttemptEvent(
                att.spec.job_id,
                att.spec.attempt,
                state,
                progress,
                exit_code=int(code),
                message=msg.strip(),
                failed_nodes=list(failed_nodes),
            )
        )
        log.info("%s attempt %d finished: %s (%s)", att.spec.job_id, att.spec.attempt, state, code)
        self._drop_view(att)  # the ranks are gone: nobody reads the copy any more
        if state != AS.ATTEMPT_STATE_FAILED:  # done, stopped or durably saved: memory not needed
            self.keepers.stop_job(att.spec.job_id)
            self.zygotes.stop_job(att.spec.job_id)
        if att.record is not None:
            att.record.final = {"state": int(state), "exit_code": int(code),
                                "message": msg.strip(), "failed_nodes": list(failed_nodes),
                                "time": time.time()}
            with contextlib.suppress(OSError):
                att.record.save()

    def running(self) -> list[RunningInfo]:
        with self._lock:
            return [
                RunningInfo(
                    a.spec.job_id,
                    a.spec.attempt,
                    a.state,
                    a.last.progress if a.last else None,
                    a.spec.node_ids(),
                )
                for a in self._attempts.values()
            ]

    def shutdown(self, grace_s: float = 0.0) -> None:
        """SIGTERM (checkpoint) then SIGKILL every attempt; waits for them to exit."""
        with self._lock:
            atts = list(self._attempts.values())
            for a in atts:
                if grace_s > 0:
                    with contextlib.suppress(OSError):  # the trainer's save deadline
                        write_stop_deadline(a.dir / STOP_DEADLINE_NAME,
                                            StopDeadline(time.time() + grace_s, grace_s))
                    self._signal_live(a, signal.SIGTERM)
                else:
                    self._signal_live(a, signal.SIGKILL)
        deadline = time.time() + grace_s
        self.keepers.shutdown()
        self.zygotes.shutdown()
        for a in atts:
            for r in a.ranks:
                if r.proc is None:  # adopted: not our child, poll /proc
                    while r.poll() is None and time.time() < deadline:
                        time.sleep(0.05)
                    if r.poll() is None:
                        self._signal_live(a, signal.SIGKILL)
                    continue
                try:
                    r.proc.wait(timeout=max(0.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    self._signal_live(a, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        r.proc.wait(timeout=5)


    # ---- restart safety (issue 15 defect 2; region_agents/executors/attempt_records.py) ----
    def _fence_older(self, job_id: str, attempt: int) -> None:
        """Kill every older attempt of ``job_id`` this work dir knows (in memory or only
        in a record left by a previous agent process) and wait until none can write."""
        for key, att in list(self._attempts.items()):
            if key[0] == job_id and key[1] < attempt and any(r.poll() is None for r in att.ranks):
                records.write_fence(att.dir)
                att.killed_by_us = True
                att.stop_mode = att.stop_mode or "kill"
                self._signal_live(att, signal.SIGKILL)
                deadline = time.monotonic() + 30.0
                while any(r.poll() is None for r in att.ranks):
                    if time.monotonic() > deadline:
                        raise ValueError(f"attempt {key[1]} of {job_id} could not be killed")
                    time.sleep(0.02)
        for rec in records.scan(self.work_dir, glob.escape(job_id)):
            if rec.job_id != job_id or rec.attempt >= attempt or (job_id, rec.attempt) in self._attempts:
                continue
            extra = records.orphan_pids([rec.dir]).get(rec.dir, []) if not rec.ranks else []
            if rec.live_pids() or extra:
                log.warning("%s attempt %d supersedes attempt %d still running from a previous"
                            " agent process: killing it", job_id, attempt, rec.attempt)
            if not records.kill_and_wait(rec, extra):
                raise ValueError(f"attempt {rec.attempt} of {job_id} could not be killed")

    def _adopted_exit_code(self, att: _Attempt) -> int:
        """Best knowledge of how a re-adopted rank ended (its exit code is not ours to
        read): the trainer's own last word in the progress file."""
        state = att.last.state if att.last is not None else ""
        if state == "done":
            return EXIT_OK
        if state == "checkpointing" and att.stop_mode == "checkpoint":
            return EXIT_CHECKPOINTED
        return -signal.SIGKILL if att.killed_by_us else 1

    def recover(self) -> list[AttemptEvent]:
        """After an agent restart: re-adopt attempts whose ranks still run (``running()``
        lists them, ``poll()`` watches them) and return the outcomes of finished attempts
        the broker has not acknowledged yet (to be re-sent)."""
        unacked: list[AttemptEvent] = []
        with self._lock:
            recs = records.scan(self.work_dir)
            missing = [r.dir for r in recs if r.final is None and not r.ranks]
            orphans = records.orphan_pids(missing)
            for rec in recs:
                if rec.final is not None:
                    if not rec.acked:
                        f = rec.final
                        unacked.append(AttemptEvent(rec.job_id, rec.attempt, int(f["state"]),
                                                    exit_code=int(f.get("exit_code", 0)),
                                                    message=str(f.get("message", "")),
                                                    failed_nodes=list(f.get("failed_nodes", [])),
                                                    time=float(f.get("time", time.time()))))
                    continue
                if (rec.job_id, rec.attempt) in self._attempts:
                    continue
                if not rec.ranks:  # died mid-launch: kill whatever it had started
                    records.kill_and_wait(rec, orphans.get(rec.dir, []))
                self._adopt(rec)
            # copies of shared checkpoints whose attempt ended while no agent ran
            live = {k for k, a in self._attempts.items() if not a.failure}
            with contextlib.suppress(OSError):
                for path in drop_stale_views(self.work_dir, live):
                    log.info("removed %s: its attempt is no longer running", path)
        return unacked

    def _adopt(self, rec: records.AttemptRecord) -> None:
        launch = agent_pb2.Launch.FromString(base64.b64decode(rec.launch_b64))
        spec = AttemptSpec.from_launch(launch)
        adir = Path(rec.dir)
        ranks = [_Rank(r.rank, r.node_id, None, adir / f"rank-{r.rank}.stderr", pid=r.pid,
                       start_ticks=r.start_ticks) for r in rec.ranks]
        att = _Attempt(spec=spec, dir=adir, progress_path=adir / "progress.json", pgid=rec.pgid,
                       ranks=ranks, started=rec.started, hang_timeout_s=rec.hang_timeout_s,
                       record=rec)
        att.last = read_progress(str(att.progress_path))
        if att.last is not None and att.last.state in ("running", "checkpointing", "done"):
            att.state = AS.ATTEMPT_STATE_RUNNING
        if not ranks:
            att.failure = (-signal.SIGKILL, "the agent died while starting this attempt", [])
        self._attempts[att.key] = att
        live = sum(1 for r in ranks if r.poll() is None)
        log.info("re-adopted %s attempt %d (%d/%d ranks alive)", rec.job_id, rec.attempt, live,
                 len(ranks))

    def known_attempts(self) -> dict[str, int]:
        """Highest attempt per job any record shows (keeps fencing across restarts)."""
        out: dict[str, int] = {}
        for rec in records.scan(self.work_dir):
            out[rec.job_id] = max(out.get(rec.job_id, 0), rec.attempt)
        return out

    def acknowledged(self, job_id: str, attempt: int) -> None:
        """The broker committed this attempt's terminal update: never re-send it."""
        path = records.record_path(self.work_dir / "jobs" / job_id / f"attempt-{attempt}")
        rec = records.AttemptRecord.load(path)
        if rec is not None and rec.final is not None and not rec.acked:
            rec.acked = True
            with contextlib.suppress(OSError):
                rec.save()


def _launch_of(spec: AttemptSpec) -> agent_pb2.Launch:
    """The Launch an AttemptSpec came from (stored in the attempt record)."""
    return agent_pb2.Launch(job_id=spec.job_id, attempt=spec.attempt, spec=spec.spec,
                            placement=spec.placement, checkpoint_uri=spec.checkpoint_uri,
                            resume_from=spec.resume_from, env=spec.env, standby=spec.standby,
                            spare_nodes=spec.spare_nodes)
