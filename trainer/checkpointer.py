"""`Checkpointer`: what a script registers once to get async saves and a one-call resume.

Built on trainer/checkpoint.py's CheckpointManager (DCP sharded saves, manifest written
last, digests, retention, N->M resharding on load) and adds what a user's loop needs:
any number of `Stateful`s besides model and optimizer (the data position, an EMA, a
counter), the choice of what to resume (CB_RESUME_FROM, else the latest complete
checkpoint under the run's checkpoint URI), and a model fingerprint in the manifest so a
resume into a different architecture fails with one clear line instead of a DCP trace.

Compared with torchtitan's CheckpointManager (the closest design): the same
model/optimizer/scheduler/dataloader registration and async DCP saves, plus what the
broker contract needs: attempt-fenced directories, durable-only progress, the grace
deadline and the last loss in the manifest.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from checkpoint_layout import parse_step
from trainer import standby, startup, telemetry
from trainer.agree import agree
from trainer.checkpoint import CheckpointManager, _outage_or, find_resume_point
from trainer.errors import StoreUnavailable
from trainer.memtier import MemoryTier, Restored
from trainer.outage_wait import OutageWait, agreed_give_up, pause_or_raise
from trainer.startup import Stage
from trainer.storage import step_name

if TYPE_CHECKING:
    from trainer.run import Run
    from trainer.sampler import ResumableSampler


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint's Stateful: anything with state_dict/load_state_dict."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def model_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """Parameter count and a digest of every parameter's name and global shape.

    Why: the manifest must say which architecture it holds so a resume into another
    one is refused up front. Names are taken without FSDP/activation-checkpointing
    wrapper prefixes, and DTensor shapes are global, so the fingerprint does not depend
    on the world size or on how the model was wrapped.
    """
    shapes = sorted(
        (name.replace("_checkpoint_wrapped_module.", ""), list(p.shape))
        for name, p in model.named_parameters()
    )
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    return {"params": sum(p.numel() for p in model.parameters()), "shapes_sha256": digest}


class Checkpointer:
    """Periodic async checkpoints, the emergency save, and resume, for one run.

    Created by `run.checkpointer(...)`; `every` = save every N steps (0 = only on
    SIGUSR1, SIGTERM and at `run.finish()`).
    """

    def __init__(
        self,
        run: Run,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        data: ResumableSampler | None = None,
        extra: dict[str, Stateful] | None = None,
        every: int = 0,
        keep_last: int = 3,
        async_save: bool = True,
        model_config: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
        storage_threads: int = 2,
    ) -> None:
        self.run = run
        self.data = data
        self.extra = dict(extra or {})
        self.every = every
        self._warm = not (async_save and every)
        base: dict[str, Any] = {
            "job_id": run.env.job_id,
            "attempt": run.env.attempt,
            "model": model_config if model_config is not None else model_fingerprint(model),
        }
        if data is not None:
            base.update(
                seed=data.seed, global_batch_size=data.global_batch, dataset_size=data.dataset_size
            )
        base.update(meta or {})
        self.manager = CheckpointManager(
            run.store,
            model=model,
            optim=optimizer,
            sched=scheduler,
            ckpt_group=run.ckpt_group,
            rank=run.rank,
            world_size=run.world_size,
            manifest_base=base,
            keep_last=keep_last,
            threads=storage_threads,
            use_async=async_save,
            on_durable=run.progress.checkpoint_durable,
            user_state=self._user_state if (data is not None or self.extra) else None,
            load_user_state=self._load_user_state,
        )
        # A store outage that saves are waiting out (None: the store answers), and the
        # newest step every rank agreed is durable (what a dropped save falls back to).
        self._outage: OutageWait | None = None
        self._durable = -1
        # The in-memory tier (docs/recovery.md): on when the launcher configured keepers.
        self.memory = MemoryTier.from_env(run, self.manager)

    # ----------------------------------------------------------------- state
    def _user_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {name: obj.state_dict() for name, obj in self.extra.items()}
        if self.data is not None:
            state["data"] = self.data.state_dict()
        return state

    def _load_user_state(self, state: dict[str, Any]) -> None:
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        for name, obj in self.extra.items():
            obj.load_state_dict(state[name])

    @property
    def samples_seen(self) -> int:
        return self.data.samples_seen if self.data is not None else 0

    @property
    def last_durable_step(self) -> int:
        """Newest step this run made durable (or resumed from); -1 if none."""
        return self.manager.last_durable_step

    # ---------------------------------------------------------------- resume
    def resume(self) -> int:
        """Load CB_RESUME_FROM, else the latest complete checkpoint, into everything
        registered; returns the step to continue from (0 when starting fresh).

        Any world size and FSDP/HSDP layout loads any other (DCP reshards); every file's
        size and digest is checked while read. A bad checkpoint raises TrainerError
        (exit 2 with one line). Incomplete saves above the resume point (an earlier
        attempt killed mid-upload) are deleted so they cannot mix into this run's files.

        Every store-touching part ends with the ranks agreeing on its outcome
        (trainer/agree.py). When the store is down, all ranks wait for it together and
        try the whole resume again, for at most CB_STORE_WAIT_S (trainer/outage_wait.py);
        past that they all raise StoreUnavailable (exit 81) and the broker waits.
        """
        startup.mark(Stage.RESUMING)
        run = self.run
        resume_from = run.env.resume_from
        if standby.go_file():
            resume_from = self._standby()
        wait, run.start_outage = run.start_outage, None  # a wait begun at start goes on
        while True:
            try:
                step, found, restored, t_locate, t_located = self._resume_once(resume_from)
                break
            except StoreUnavailable as exc:  # agreed: every rank is here
                wait = wait or OutageWait(run.env.store_wait_s)
                pause_or_raise(run, wait, exc, "resuming")
        if wait is not None:
            run.log(f"checkpoint store answered again after {wait.waited():.1f}s"
                    f" ({wait.tries} tries); resumed at step {step}")
        run._started(step)
        if found is not None and restored is None:  # a resume's time (a move's downtime ends here)
            run.log(f"resume: located in {t_located - t_locate:.3f}s, loaded and agreed in "
                    f"{time.perf_counter() - t_located:.3f}s")
        return step

    def _resume_once(
        self, resume_from: str
    ) -> tuple[int, tuple[Any, str] | None, Restored | None, float, float]:
        """One try at the whole resume; every failure agreed by all ranks."""
        run, m = self.run, self.manager
        step = 0
        t_locate = time.perf_counter()
        found, failure = None, None
        try:
            found = find_resume_point(run.store, resume_from, run.s3_max_concurrency)
        except Exception as exc:  # noqa: BLE001 - agreed: raised on every rank
            failure = exc
        agree(failure, m.group, run.world_size)
        t_located = time.perf_counter()
        restored = None
        if self.memory is not None:  # newer than the store's, or as new: no store read
            durable = parse_step(found[1]) if found is not None else 0
            t0 = time.perf_counter()
            restored = self.memory.restore(min_step=max(1, durable))
            laps = self.memory.restore_s
            if laps:  # where the restore's time went, for the benchmark and an operator
                moved = self.memory.restore_bytes
                run.progress.update(memory_restore_s=laps, memory_restore_bytes=moved)
                run.log("memory tier: restore stages " + ", ".join(
                    f"{k} {v:.2f}s" for k, v in laps.items())
                    + f"; read {moved['read'] / 1e6:.1f} MB, {moved['direct'] / 1e6:.1f} MB "
                      "of it straight into the live tensors")
            if restored is not None:
                step, from_peer = restored.step, restored.from_peer
                how = ("" if restored.saved_world == run.world_size else
                       f", resharded from {restored.saved_world} ranks to {run.world_size}")
                run.log(f"resumed from the memory tier (step {step}{how}; shards of ranks "
                        f"{from_peer or 'none'} from another node's keeper, the others "
                        f"from their own node's) in {time.perf_counter() - t0:.2f}s; newest "
                        f"durable checkpoint: step {durable}")
                if found is not None:
                    run.progress.checkpoint_durable(durable, found[0].uri(found[1]))
                m.last_durable_step = durable if found is not None else -1
                run.progress.update(resume_tier="memory", resumed_step=step,
                                    restored_from_peer=from_peer,
                                    resumed_from_world_size=restored.saved_world)
            elif found is not None:
                run.log("memory tier: no step every rank holds at or after the newest durable "
                        f"checkpoint (step {durable}); resuming from the store")
        if restored is None and found is not None:
            run.progress.update(resume_tier="store")
            src, name = found
            t0 = time.perf_counter()
            manifest = m.load(name, store=src)  # agreed inside
            telemetry.checkpoint_loaded(t0, manifest, src.uri(name))
            step = int(manifest["step"])
            run.log(
                f"resumed from {src.uri(name)} (step {step}, saved on {manifest['world_size']} "
                f"ranks, loaded on {run.world_size}) in {time.perf_counter() - t0:.2f}s"
            )
            run._resumed(step, src.uri(name), manifest.get("loss"))
        elif restored is None:
            run.log(f"no complete checkpoint under {run.env.checkpoint_uri}: starting at step 0")
        failure, dropped = None, []
        if run.rank == 0:
            try:
                dropped = m.drop_incomplete(step)
            except Exception as exc:  # noqa: BLE001 - agreed: raised on every rank
                failure = exc
        agree(failure, m.group, run.world_size)  # also the barrier before anyone saves
        if dropped:
            run.log(f"removed incomplete checkpoints of a previous attempt: steps {dropped}")
        return step, found, restored, t_locate, t_located

    def _standby(self) -> str:
        """Make-before-break (trainer/standby.py): everything a resume can do without the
        checkpoint is done, then block for the go; returns the checkpoint to load.

        Before the go this attempt has taken no step and cannot save (step 0 is never
        saved), so it can never write beside the source attempt it replaces."""
        run = self.run
        t0 = time.perf_counter()
        self.manager.prepare_load()
        run.progress.update(state="standby")
        run.log(f"standby: ready in {time.perf_counter() - t0:.2f}s after model build; "
                "waiting for the go (the source's final checkpoint)")
        t1 = time.perf_counter()
        try:
            go = standby.wait_for_go(standby.go_file(), lambda: run.flags.term)
        except standby.StandbyAborted as exc:
            run.log(f"standby ended before its go ({exc}): no step taken, nothing saved")
            from trainer.run import EXIT_TERMINATED

            run._end(EXIT_TERMINATED)
        run.log(f"standby: go after {time.perf_counter() - t1:.2f}s; resuming from "
                + (go.resume_from or "the newest complete checkpoint under the own root"))
        return go.resume_from

    # ------------------------------------------------------------------ save
    def save(self, step: int, *, blocking: bool = False, deadline: float | None = None) -> bool:
        """Checkpoint `step` (async unless `blocking`); False when nothing was saved:
        step 0 (no optimizer step yet) is never saved (issue 15: it is not a training
        state), and a periodic save is skipped while the store is down. The last
        reported loss goes into the manifest.

        A store outage (trainer/outage_wait.py) does not end the attempt while the
        ``CB_STORE_WAIT_S`` budget lasts: a failed periodic save is dropped and training
        goes on (the next periodic save tries again); a blocking save (the final one, a
        stop without a deadline) holds, every rank waiting with backoff, and saves once
        the store answers. Past the budget the ranks exit 81 together. A save with a
        ``deadline`` (a SIGTERM's emergency save) cannot wait: it fails as before.
        Every save ends with the ranks agreeing on its outcome (trainer/agree.py): only
        rank 0 commits, so only rank 0 may see the store refuse the manifest."""
        if step < 1:
            return False
        if not (self._warm or blocking) and step != self.manager.last_saved_step:
            # first async save: fault in the staging buffers now that optimizer state exists
            self._warm = True
            self.run.log(f"async checkpoint staging buffers ready in {self.warm():.2f}s")
        meta = {"loss": self.run.last_loss} if self.run.last_loss is not None else {}
        if deadline is not None:
            self.manager.save(
                step, self.samples_seen, blocking=blocking, deadline=deadline, meta=meta
            )
            return True
        self._settle()  # a previous save lost to the outage: this one tries again
        if not blocking:
            # Started, not agreed: the save's own thread is now in collectives on the
            # checkpoint group, and a collective of ours beside it could pair with one of
            # them on another rank (a hang: seen in the store-outage campaign). Starting
            # touches neither the store nor the group; how it ends is agreed by the next
            # save's _settle, on an idle group.
            self.manager.save(step, self.samples_seen, meta=meta)
            return True
        while True:
            failure: BaseException | None = None
            try:
                self.manager.save(step, self.samples_seen, blocking=True, meta=meta)
            except Exception as exc:  # noqa: BLE001 - agreed below, raised on every rank
                failure = _outage_or(self.run.store, exc)
            try:
                agree(failure, self.manager.group, self.run.world_size)
            except StoreUnavailable as exc:
                self._abandon(step)
                pause_or_raise(self.run, self._outage_wait(), exc, f"saving step {step}")
                continue
            self._store_back(step)
            return True

    def _outage_wait(self) -> OutageWait:
        if self._outage is None:
            self._outage = OutageWait(self.run.env.store_wait_s)
        return self._outage

    def _settle(self) -> bool:
        """Wait for the in-flight save and agree on how it ended; False when the store
        was down for it (dropped, training goes on) -- past the budget StoreUnavailable
        on every rank. Any other failure is raised on every rank (agree)."""
        m = self.manager
        failure: BaseException | None = None
        try:
            m.wait()
        except Exception as exc:  # noqa: BLE001 - agreed below
            failure = _outage_or(self.run.store, exc)
        step = m._inflight_step
        try:
            agree(failure, m.group, self.run.world_size)
        except StoreUnavailable as exc:
            self._abandon(step)
            self._train_on(exc, step)
            return False
        if step >= 0 and m.last_durable_step >= step:
            self._store_back(step)
        self._durable = m.last_durable_step
        return True

    def _abandon(self, step: int) -> None:
        """Forget a save the store refused on some rank: a retry of the same step must
        not be taken for a no-op, and a rank whose own part was written (all but the
        committing rank 0) must not count the step durable."""
        m = self.manager
        if m.last_durable_step >= step:
            m.last_durable_step = self._durable
        m.last_saved_step = m.last_durable_step

    def _train_on(self, exc: StoreUnavailable, step: int) -> None:
        """A periodic save failed on an outage: keep training while the budget lasts
        (agreed), else raise ``exc`` on every rank (exit 81, the broker waits)."""
        run = self.run
        wait = self._outage_wait()
        if agreed_give_up(wait.give_up(), run.ckpt_group, run.world_size):
            run.log(f"checkpoint store still unreachable after {wait.waited():.1f}s"
                    f" (CB_STORE_WAIT_S={wait.budget_s:g}): exiting for the broker to wait")
            raise exc
        wait.tries += 1
        run.progress.update(store_wait_since=wait.since_wall, store_wait_message=str(exc)[:300])
        nxt = f"the save at step {step + self.every} tries again" if self.every else \
            "the final save waits for it"
        run.log(f"checkpoint of step {step} not saved: {exc}; training on, {nxt}"
                f" ({wait.waited():.0f}s of {wait.budget_s:g}s)")

    def _store_back(self, step: int) -> None:
        """A save was durable after an outage: say so once, clear the progress note."""
        wait, self._outage = self._outage, None
        if wait is None:
            return
        progress = self.run.progress
        state = progress.snapshot().get("state")  # a held final save is still checkpointing
        progress.update(state="checkpointing" if state == "store_wait" else state,
                        store_wait_since=None, store_wait_message=None)
        self.run.log(f"checkpoint store answered again after {wait.waited():.1f}s"
                     f" ({wait.tries} tries); step {step} durable")

    def warm(self) -> float:
        """Allocate the async staging buffers (after the first step); seconds taken."""
        self._warm = True
        return self.manager.warm_staging()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is durable."""
        self.manager.wait()

    def uri(self, step: int) -> str:
        return self.run.store.uri(step_name(step))
