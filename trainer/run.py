"""`init()` and `Run`: the library a plain PyTorch training script uses to become portable.

    import trainer as cb
    run = cb.init(total_steps=1000)                 # process group, mesh, signals, progress
    model = run.shard(model)                        # optional: FSDP2 (or HSDP) on run.mesh
    sampler = cb.ResumableSampler(len(ds), global_batch=64, seed=0, micro_batch=8)
    ckpt = run.checkpointer(model=model, optimizer=opt, scheduler=sched, data=sampler, every=50)
    for step in range(ckpt.resume() + 1, 1001):     # 0 fresh, else the checkpoint's step
        ...forward/backward over sampler.next() ...; opt.step(); sched.step()
        run.step_done(step, loss=loss, tokens=n)   # progress, periodic save, SIGTERM/SIGUSR1
    run.finish()                                    # final checkpoint, exit 0

What the library owns so the script never does it by hand (docs/contracts.md):
* exit codes: 0 after `finish()`, 75 after the emergency checkpoint a SIGTERM asked for,
  76 when that save cannot be durable within CB_GRACE_S, 2 with one stderr line for a
  bad checkpoint / configuration / unreachable store (`TrainerError`), 77 with one line
  when the checkpoint to resume from is gone (`ResumeUnavailable`), 1 with one line
  when a save fails after bounded retries;
* the progress file (CB_PROGRESS_FILE) with its heartbeat, and the signal agreement
  (one all_reduce per step so every rank stops after the same step).

Outside the broker (no CB_* variables) the same script runs as one process or under
torchrun, checkpointing into `checkpoint_dir` and resuming from it.

Why `finish()` and the stop paths end the process (a `RunExit`, i.e. SystemExit, then
`os._exit` at interpreter exit): FSDP2 + gloo sometimes aborts in the normal teardown
(exit -6 about 1 run in 10, TRAINER-NOTES); the exit code is the contract with the agent.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from checkpoint_layout.faults import describe, is_outage
from checkpoint_layout.stop_deadline import read_stop_deadline
from trainer import startup
from trainer.agree import agree
from trainer.checkpoint import GraceExceeded
from trainer.config import RunEnv, load_run_env
from trainer.errors import (
    EXIT_BAD_CONFIG,
    EXIT_CHECKPOINTED,
    EXIT_GRACE_EXCEEDED,
    EXIT_OK,
    EXIT_RESUME_UNAVAILABLE,
    EXIT_STORE_UNAVAILABLE,
    CheckpointSaveError,
    PeerCrashed,
    ResumeUnavailable,
    StoreUnavailable,
    TrainerError,
)
from trainer.outage_wait import OutageWait, pause_or_raise
from trainer.parallel import (
    Parallelism,
    build_mesh,
    init_process_group,
    shard_module,
    shutdown_and_exit,
)
from trainer.progress import ProgressReporter
from trainer.signals import SignalFlags, install_flags
from trainer.startup import Stage
from trainer.storage import Store, open_store

if TYPE_CHECKING:
    from trainer.checkpointer import Checkpointer

EXIT_TERMINATED = 143  # SIGTERM'd with no checkpointer: nothing saved, as if killed (128+15)


class RunExit(SystemExit):
    """Raised by `finish()` and the SIGTERM path: unwinds the script (its `finally`
    blocks run), then the interpreter exits with the contract's code."""


def grace_deadline(term_time: float, grace_s: float) -> float:
    """When the emergency save must be done: CB_GRACE_S after SIGTERM, minus a margin
    (10%, at most 5 s) so the process has exited before the agent's SIGKILL."""
    return term_time + grace_s - min(5.0, 0.1 * grace_s)


def stop_deadline(term_time: float, grace_s: float) -> tuple[float, float, str]:
    """(deadline on the monotonic clock, the grace it stands for, where it came from)
    of the emergency save after a SIGTERM at ``term_time``.

    The stop's own deadline (CB_STOP_DEADLINE_FILE, written by the agent right before
    its SIGTERM: checkpoint_layout/stop_deadline.py) wins over CB_GRACE_S, which was
    fixed at launch: a drain may allow 10 minutes, a spot notice less than two. The same
    margin (10% of that grace, at most 5 s) keeps the exit ahead of the agent's SIGKILL."""
    sd = read_stop_deadline()
    if sd is None:
        return grace_deadline(term_time, grace_s), grace_s, "CB_GRACE_S"
    grace = sd.grace_s if sd.grace_s > 0 else max(0.0, sd.deadline - time.time())
    left = sd.deadline - time.time()
    return time.monotonic() + left - min(5.0, 0.1 * grace), grace, "the stop"


class Run:
    """One process's view of a training run. Create it with `init()`."""

    def __init__(
        self,
        env: RunEnv,
        store: Store,
        *,
        total_steps: int | None,
        parallelism: Parallelism,
        hsdp_replicate: int,
        timeout_s: float,
        heartbeat_s: float,
        s3_max_concurrency: int,
        log_prefix: str,
        flags: SignalFlags,
    ) -> None:
        self.env, self.store, self.flags = env, store, flags
        # the store was down at start: the wait resume() continues (_agree_store_up)
        self.start_outage: OutageWait | None = None
        self.total_steps = total_steps
        self.s3_max_concurrency = s3_max_concurrency
        self.log_prefix = log_prefix
        self.rank, self.world_size, self.local_rank = env.rank, env.world_size, env.local_rank
        self.attempt = env.attempt  # the broker's attempt number (CB_ATTEMPT); 0 outside it
        self.device, self.backend = init_process_group(
            env.rank, env.world_size, env.local_rank, timeout_s
        )
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
        self.mesh = build_mesh(
            self.device.type, env.world_size, parallelism, hsdp_replicate, local_world
        )
        # async DCP on the default group interleaves with FSDP's collectives (gloo abort)
        self.ckpt_group = dist.new_group(backend="gloo")
        self.progress = ProgressReporter(
            env.progress_file,
            env.rank == 0,
            {
                "job_id": env.job_id,
                "attempt": env.attempt,
                "total_steps": total_steps or 0,
                "world_size": env.world_size,
            },
            heartbeat_s,
        )
        self.progress.start()
        self.step = 0
        self.last_loss: float | None = None
        self._ckpt: Checkpointer | None = None
        self._t_last = time.perf_counter()
        self._exit_code: int | None = None
        # flags carried by all_sum: (stop, checkpoint now, a rank's snapshot still sending)
        self._agreed: tuple[bool, bool, bool] | None = None

    # --------------------------------------------------------------- helpers
    @property
    def is_main(self) -> bool:
        """Rank 0: the one that should print and write files meant once per job."""
        return self.rank == 0

    def log(self, msg: str) -> None:
        """Print on rank 0 only (what the agent's log shows once per job)."""
        if self.rank == 0:
            print(f"{self.log_prefix}: {msg}", flush=True)

    def all_sum(self, value: torch.Tensor | float) -> float:
        """Sum of a scalar over all ranks (e.g. per-rank loss sums -> the global loss).

        The same all_reduce carries the ranks' SIGTERM/SIGUSR1 flags, so `step_done`
        after it needs no collective of its own (one fewer per step; every rank must
        call it the same number of times per step, as with any collective)."""
        v = torch.as_tensor(value, dtype=torch.float32).detach().reshape(1).to(self.device)
        if self.world_size == 1:
            return float(v[0])
        flags = torch.tensor([*self.flags.local(), int(self._snapshot_busy())],
                             dtype=torch.float32, device=self.device)
        t = torch.cat([v, flags])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        self._agreed = (bool(t[1].item() > 0), bool(t[2].item() > 0), bool(t[3].item() > 0))
        return float(t[0])

    def _snapshot_busy(self) -> bool:
        """This rank's previous memory-tier snapshot is still being sent (see step_done)."""
        ck = self._ckpt
        return ck is not None and ck.memory is not None and ck.memory.busy()

    def shard(
        self,
        model: nn.Module,
        *,
        blocks: list[nn.Module] | None = None,
        mixed_precision: str = "none",
        activation_checkpointing: bool = False,
    ) -> nn.Module:
        """FSDP2 `fully_shard` each block then the root on `run.mesh` (FSDP or HSDP).

        `blocks` default to the elements of the model's largest ModuleList (GPT-2's
        `transformer.h`, Llama's `model.layers`). Optional: an unsharded model also
        checkpoints and resumes (each rank then holds the whole model)."""
        return shard_module(
            model,
            self.mesh,
            self.device,
            blocks=blocks,
            mixed_precision=mixed_precision,
            activation_checkpointing=activation_checkpointing,
        )

    def checkpointer(
        self, *, model: nn.Module, optimizer: torch.optim.Optimizer, **options: Any
    ) -> Checkpointer:
        """Register the training state; one per run. ``options`` are `Checkpointer`'s
        keywords (scheduler, data, extra, every, keep_last, async_save, model_config,
        meta, storage_threads), documented there so the list has one home."""
        from trainer.checkpointer import Checkpointer

        self._ckpt = Checkpointer(self, model=model, optimizer=optimizer, **options)
        return self._ckpt

    def request_stop(self) -> None:
        """Stop after the next `step_done` with a checkpoint and exit 75, as a SIGTERM
        would, without its deadline (call it on every rank at the same step)."""
        self.flags.request_stop()

    # ------------------------------------------------------------ the loop
    def _resumed(self, step: int, uri: str, loss: float | None) -> None:
        self.progress.checkpoint_durable(step, uri)
        if loss is not None:
            self.last_loss = float(loss)
            self.progress.update(loss=self.last_loss)

    def _started(self, step: int) -> None:
        startup.mark(Stage.RESTORED)
        self.step = step
        samples = self._ckpt.samples_seen if self._ckpt is not None else 0
        self.progress.update(state="running", step=step, samples_seen=samples,
                             resumed_time=time.time(),  # training (re)starts: a move's downtime ends
                             store_wait_since=None, store_wait_message=None)  # any wait is over
        self._t_last = time.perf_counter()
        self._agreed = None

    def step_done(
        self, step: int, *, loss: torch.Tensor | float | None = None, tokens: int = 0
    ) -> None:
        """Call after each optimizer step, on every rank, with the 1-based step number.

        Reports progress (rank 0), then: at `total_steps` returns (`finish()` saves);
        on SIGTERM (any rank) all ranks save an emergency checkpoint of this step and
        exit 75 (76 past CB_GRACE_S); on SIGUSR1 or every `every` steps, starts an
        async checkpoint. `loss`: the value to report (pass the global one, e.g. via
        `all_sum`); `tokens`: tokens this step processed over all ranks (for tokens/s).
        """
        if step < 1:
            raise ValueError("step_done(step): step counts optimizer steps and starts at 1")
        now = time.perf_counter()
        dt, self._t_last = now - self._t_last, now
        self.step = step
        if loss is not None:
            self.last_loss = float(loss)
        ck = self._ckpt
        self.progress.update(
            lazy=True,
            state="running",
            step=step,
            samples_seen=ck.samples_seen if ck is not None else 0,
            loss=self.last_loss,
            tokens_per_s=tokens / max(dt, 1e-9) if tokens else 0.0,
            step_time=time.time(),
        )
        if not startup.reached(Stage.FIRST_STEP):
            self._first_step_done()
        if self.total_steps and step >= self.total_steps:
            return
        if ck is not None and not ck._warm:
            self.log(f"async checkpoint staging buffers ready in {ck.warm():.2f}s")
        agreed, self._agreed = self._agreed, None
        if agreed is not None:
            stop, ckpt_now, busy = (*self.flags.settle(*agreed[:2]), agreed[2])
        else:
            stop, ckpt_now, busy = self.flags.agree(self.device, self._snapshot_busy())
        if stop:
            self._stop(step)
        if ck is not None and (ckpt_now or (ck.every and step % ck.every == 0)):
            ck.save(step)
        if ck is not None and ck.memory is not None:
            # `busy` is every rank's view: all take this snapshot or all skip it, so the
            # keepers hold the same steps of every rank (trainer/memtier.py says why)
            ck.memory.maybe_snapshot(step, ck.samples_seen, any_busy=busy)

    def _first_step_done(self) -> None:
        """This attempt's start is over: its stages go to the progress file (the
        recovery breakdown, trainer/startup.py) and one log line."""
        startup.mark(Stage.FIRST_STEP)
        stages = startup.times()
        self.progress.update(startup=stages)
        self.log(f"started: {startup.summary(stages)}")

    def _stop(self, step: int) -> NoReturn:
        self.progress.update(state="checkpointing")
        ck = self._ckpt
        if ck is None:
            self.log(f"stopped at step {step} with no checkpointer: nothing saved")
            self._end(EXIT_TERMINATED)
        t0 = time.perf_counter()
        term = self.flags.term_time
        deadline, grace, source = (stop_deadline(term, self.env.grace_s) if term
                                   else (None, self.env.grace_s, "CB_GRACE_S"))
        try:
            ck.save(step, blocking=True, deadline=deadline)
        except GraceExceeded as exc:
            last = ck.last_durable_step
            print(
                f"trainer error (rank {self.rank}): emergency checkpoint of step {step} could "
                f"not complete within {_grace_text(grace, source)} after SIGTERM ({exc}); "
                f"exiting {EXIT_GRACE_EXCEEDED} without it. Latest complete checkpoint: "
                + (f"step {last}" if last >= 0 else "none"),
                file=sys.stderr,
                flush=True,
            )
            self.progress.stop()
            # a save thread may still sit in a collective: exit now, do not unwind
            shutdown_and_exit(EXIT_GRACE_EXCEEDED)
        waited = time.monotonic() - term if term else 0.0
        self.log(
            f"stopped at step {step}; checkpoint durable in {time.perf_counter() - t0:.2f}s "
            f"({waited:.1f}s after SIGTERM, grace {grace:.0f}s from {source}); exit 75"
        )
        self.progress.update(state="checkpointing")
        self._end(EXIT_CHECKPOINTED)

    def finish(self) -> NoReturn:
        """Final checkpoint (blocking), progress `done`, exit 0. Does not return."""
        ck = self._ckpt
        self.progress.update(state="checkpointing")
        if ck is not None:
            ck.save(self.step, blocking=True)  # a no-op if this step is durable already
        self.progress.update(state="done")
        self.log(f"done: {self.step} steps" + (", final checkpoint durable" if ck else ""))
        self._end(EXIT_OK)

    def _end(self, code: int) -> NoReturn:
        self.progress.stop()
        self._exit_code = code
        sys.stdout.flush()
        raise RunExit(code)

    # -------------------------------------------------------- process exit
    def _atexit(self) -> None:
        if self._exit_code is not None:
            shutdown_and_exit(self._exit_code)
        if self._ckpt is not None and self.step > self._ckpt.last_durable_step:
            # the script ended without finish(): say so rather than look "done"
            print(
                f"trainer: warning (rank {self.rank}): the script ended without run.finish(); "
                f"step {self.step} has no final checkpoint",
                file=sys.stderr,
                flush=True,
            )

    def _excepthook(self, tp: type[BaseException], exc: BaseException, tb: Any) -> None:
        self.progress.stop()
        _report_and_exit(tp, exc, tb)


def _grace_text(grace: float, source: str) -> str:
    """``CB_GRACE_S=120s`` or ``the stop's grace of 110s`` (stderr lines people read)."""
    return f"CB_GRACE_S={grace:g}s" if source == "CB_GRACE_S" else f"the stop's grace of {grace:g}s"


def _report_and_exit(tp: type[BaseException], exc: BaseException, tb: Any) -> NoReturn:
    """Uncaught errors: the contract's one line + exit code, not a torch trace."""
    rank = os.environ.get("RANK", "0")
    if isinstance(exc, StoreUnavailable):  # an outage, not the job's fault: the broker waits
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_STORE_UNAVAILABLE
    elif isinstance(exc, TrainerError):
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_BAD_CONFIG
    elif isinstance(exc, ResumeUnavailable):  # not a config error: the broker relaunches
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_RESUME_UNAVAILABLE
    elif isinstance(exc, CheckpointSaveError):
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = 1
    elif isinstance(exc, PeerCrashed):  # the crashed peer printed its own traceback
        print(f"trainer error (rank {rank}): stopping with a peer: {exc}", file=sys.stderr,
              flush=True)
        code = 1
    elif is_outage(exc):  # the store went down where no caller said so: still an outage
        print(f"trainer error (rank {rank}): checkpoint store unreachable: {describe(exc)}",
              file=sys.stderr, flush=True)
        code = EXIT_STORE_UNAVAILABLE
    else:
        sys.__excepthook__(tp, exc, tb)
        code = 1
    shutdown_and_exit(code)


def init(
    *,
    total_steps: int | None = None,
    checkpoint_dir: str = "checkpoints",
    parallelism: Parallelism | str = Parallelism.AUTO,
    hsdp_replicate: int = 2,
    timeout_s: float = 300.0,
    heartbeat_s: float = 2.0,
    s3_max_concurrency: int = 8,
    log_prefix: str = "trainer",
    handle_exit: bool = True,
) -> Run:
    """Start this process's part of the run; call it once, first, on every rank.

    Reads torchrun's RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* (absent = one process) and the
    broker's CB_* variables (docs/contracts.md section 1); without CB_CHECKPOINT_URI,
    checkpoints go to `checkpoint_dir` (a local path or s3://bucket/prefix). Installs the
    SIGTERM/SIGUSR1 handlers, checks the checkpoint store is reachable (TrainerError
    otherwise), creates the process group (NCCL on GPU, gloo on CPU), the DeviceMesh
    (`parallelism`: AUTO = HSDP across nodes, FSDP within one) and the progress file.
    `handle_exit` (default): map uncaught TrainerError/CheckpointSaveError to the
    contract's exit codes with one stderr line; `python -m trainer` does that itself.
    """
    startup.mark(Stage.IMPORTED)
    flags = install_flags()
    # DCP warns about defaults and single-process loads; not actionable in a job's log
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\..*")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\..*")
    if handle_exit:  # errors of init itself (no store, bad env) get the one line too
        sys.excepthook = _report_and_exit
    env = load_run_env(default_checkpoint_uri=checkpoint_dir)
    store = open_store(env.checkpoint_uri, s3_max_concurrency)
    down: StoreUnavailable | None = None
    try:
        store.check_reachable()  # before peers are involved: a bad endpoint fails fast, clearly
    except StoreUnavailable as exc:  # an outage may be one rank's view: agreed below
        down = exc
    run = Run(
        env,
        store,
        total_steps=total_steps,
        parallelism=Parallelism(parallelism),
        hsdp_replicate=hsdp_replicate,
        timeout_s=timeout_s,
        heartbeat_s=heartbeat_s,
        s3_max_concurrency=s3_max_concurrency,
        log_prefix=log_prefix,
        flags=flags,
    )
    if handle_exit:
        sys.excepthook = run._excepthook
        atexit.register(run._atexit)
    _agree_store_up(run, down)
    startup.mark(Stage.PROCESS_GROUP)
    return run


def _agree_store_up(run: Run, down: StoreUnavailable | None) -> None:
    """The ranks agree whether the store answered at start; if it did not, they go on
    building the model and :meth:`Checkpointer.resume` waits for the store.

    Why agree after the process group: a store that goes down while the ranks start can
    refuse one rank's probe and answer another's; a rank that exited alone left its
    peer waiting for it in the rendezvous or the first collective until a timeout
    traceback. Why not wait here: the script builds its model, optimizer and
    checkpointer between ``init()`` and ``resume()`` (seconds, tens of seconds on a
    loaded host), and none of it needs the store. Waiting here put all of it after the
    outage's end; the fault campaign measured 17 s of a start's recovery spent so. The
    wait started here (``run.start_outage``) goes on in ``resume()``, one budget for
    both. With no budget (``CB_STORE_WAIT_S=0``) the ranks give up here, as before.
    """
    try:
        agree(down, run.ckpt_group, run.world_size)
        return
    except StoreUnavailable as exc:
        wait = OutageWait(run.env.store_wait_s)
        if run.env.store_wait_s <= 0:  # the same on every rank: all raise here
            pause_or_raise(run, wait, exc, "starting")
        run.start_outage = wait
        run.progress.update(state="store_wait", store_wait_since=wait.since_wall,
                            store_wait_message=str(exc)[:300])
        run.log(f"checkpoint store unreachable while starting ({exc}); building the model"
                " meanwhile, the resume waits for the store")
