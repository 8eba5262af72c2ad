"""Sharded checkpoints with torch.distributed.checkpoint (DCP), torchtitan-style.

What is saved: model + optimizer (via `get_state_dict`, so FSDP/HSDP DTensor shards are
saved with their global layout and DCP can reshard them on load to any world size), plus
a small `trainer` dict: step, samples_seen (the data position), LR scheduler state and
the RNG state.

Commit protocol (docs/contracts.md section 3): DCP writes the shard files and, once
every rank has reported success, its `.metadata`; only then rank 0 writes
`manifest.json` (step, samples_seen, world size, attempt, job id, model config, file
list with sizes). No manifest = incomplete = never loaded; latest = highest step with a
manifest; older complete ones beyond `keep_last`, and abandoned incomplete ones, are
pruned after each commit.

Async: `dcp.async_save` in thread mode on a dedicated gloo group (the default group
would interleave with FSDP's collectives), at most one save in flight: a new save
first waits for the previous one. Staging copies the state to CPU before training
resumes, so the snapshot is consistent. The manifest is written from the future's done
callback on rank 0, so it lands as soon as the data is durable: the training thread
only ever does the staging copy (no manifest, fsync or upload).

Checksums: every file's xxh3-128 is computed while it is written (shardio.py) and listed
in the manifest; loads check size + digest of every file they read (exit 2 on mismatch).
xxh3-128, not sha256: it guards against accidental damage (truncation, bit rot, a file
from another checkpoint), which it detects as surely, several times faster
per core (benchmarks/bench_hash.py); a cryptographic hash would add nothing, because whoever can rewrite a shard can
rewrite the manifest beside it. Manifests of version 2 (sha256) are still verified.

Deadline (CB_GRACE_S): a save given a `deadline` runs on a helper thread and is waited
for only until then; past it, `GraceExceeded` is raised and the caller exits with
EXIT_GRACE_EXCEEDED before the agent's SIGKILL. No manifest was written for that save,
so the previous complete checkpoint stays the latest.

Over 400 lines on purpose: ``CheckpointManager`` is one commit protocol (stage, save,
manifest last, retention, resume with its fallbacks) whose steps share its state; the
storage and the byte path are already ``storage.py`` and ``shardio.py``.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from checkpoint_layout import MANIFEST, MANIFEST_VERSION, latest_complete, parse_step, step_name
from checkpoint_layout import manifest as manifest_format
from checkpoint_layout.faults import describe, is_outage
from trainer import rng, telemetry
from trainer.agree import agree
from trainer.config import ModelConfig
from trainer.errors import CheckpointSaveError, ResumeUnavailable, StoreUnavailable, TrainerError
from trainer.storage import Store, open_store, split_checkpoint_uri

__all__ = ["MANIFEST_VERSION", "CheckpointManager", "GraceExceeded", "find_resume_point"]


# The manifest's "rng" value when every rank saved its own generators (trainer/rng.py).
RNG_PER_RANK = "per-rank"


class GraceExceeded(Exception):
    """A save could not finish before its deadline (CB_GRACE_S after SIGTERM)."""


class ReusedBufferStager:
    """DCP AsyncStager that copies model/optim tensors into CPU buffers allocated once.

    Why: DCP's default stager allocates a fresh CPU copy of the whole state on every
    async save; for the 200M model that is 3 GB of page faults each time, which on CPU
    made "async" block almost as long as a sync save (benchmark). Reusing the buffers
    (torchtitan keeps a pinned cache the same way) leaves only a memcpy on the training
    thread. Safe because at most one save is in flight: the next stage() runs only
    after the previous upload finished. Pinned memory only when CUDA exists.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None
        self._keys: Any = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        tensors = {k: state_dict[k] for k in ("model", "optim")}
        keys = (tuple(tensors["model"]), repr(_shape_sig(tensors["optim"])))
        if self._cache is None or keys != self._keys:  # e.g. optimizer state appeared
            self._cache = _create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())
            self._keys = keys
        staged = _copy_state_dict(tensors, self._cache)
        staged["trainer"] = copy.deepcopy(state_dict["trainer"])
        return staged

    def synchronize_staging(self) -> None:
        """Copies are synchronous on CPU."""

    def close(self) -> None:
        self._cache = None


def _shape_sig(obj: Any) -> Any:
    if isinstance(obj, dict):
        return tuple((k, _shape_sig(v)) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0])))
    if isinstance(obj, list | tuple):
        return tuple(_shape_sig(v) for v in obj)
    if isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), str(obj.dtype))
    return type(obj).__name__


class CheckpointManager:
    def __init__(
        self,
        store: Store,
        *,
        model: torch.nn.Module,
        optim: torch.optim.Optimizer,
        sched: Any = None,
        ckpt_group: dist.ProcessGroup,
        rank: int,
        world_size: int,
        manifest_base: dict[str, Any],
        keep_last: int,
        threads: int,
        use_async: bool,
        on_durable: Callable[[int, str], None] | None = None,
        user_state: Callable[[], dict[str, Any]] | None = None,
        load_user_state: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`user_state` / `load_user_state`: the library's registered `Stateful`s (data
        position, anything the script adds), saved as small items beside the trainer's
        own; `load_user_state` gets back what `user_state()` returned at save time."""
        self.store = store
        self.model, self.optim, self.sched = model, optim, sched
        self.group = ckpt_group
        self.rank, self.world_size = rank, world_size
        self.manifest_base = manifest_base
        self.keep_last = keep_last
        self.threads = threads
        self.use_async = use_async
        self.on_durable = on_durable
        self.user_state, self.load_user_state = user_state, load_user_state
        self._stager = ReusedBufferStager()
        self._inflight: Future | None = None
        self._inflight_step = -1
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._deadline_pool: ThreadPoolExecutor | None = None
        self._meta: dict[int, dict[str, Any]] = {}
        self.last_durable_step = -1
        self.last_saved_step = -1  # last step a save was started for
        self.stats: list[dict[str, float]] = []
        self._prepared: dict[str, Any] | None = None  # prepare_load()'s skeleton, used once

    # ------------------------------------------------------------------ state
    def _state(self, step: int, samples_seen: int) -> dict[str, Any]:
        msd, osd = get_state_dict(self.model, self.optim)
        return {"model": msd, "optim": osd, "trainer": self.trainer_state(step, samples_seen)}

    def trainer_state(self, step: int, samples_seen: int) -> dict[str, Any]:
        """The small part of a checkpoint beside model and optimizer (step, data position,
        scheduler, user state, every RNG); the in-memory tier takes it on its own."""
        extra: dict[str, Any] = {
            "step": step,
            "samples_seen": samples_seen,
            "rng": torch.get_rng_state(),  # one copy for all ranks: what older readers load
            rng.PER_RANK_KEY: rng.saved_entry(self.rank),  # each rank's every generator
        }
        if self.sched is not None:
            extra["lr_sched"] = self.sched.state_dict()
        if self.user_state is not None:
            extra["user"] = self.user_state()
        return extra

    # ------------------------------------------------------------------- save
    def warm_staging(self) -> float:
        """Allocate and fault in the async staging buffers now; returns the seconds it took.

        Why: the first async save otherwise pays for 3 GB (200m model) of fresh pages
        on the training thread and blocks about as long as a sync save. Called once
        the optimizer state exists (after the first step), outside any save; the
        benchmark reports this cost separately.
        """
        if not self.use_async:
            return 0.0
        t0 = time.perf_counter()
        self._stager.stage(self._state(0, 0))
        return time.perf_counter() - t0

    def save(
        self,
        step: int,
        samples_seen: int,
        *,
        blocking: bool = False,
        deadline: float | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Start a checkpoint of `step`; blocking=True (emergency / final) waits until durable.

        `deadline` (time.monotonic() value, blocking saves only): raise GraceExceeded
        instead of waiting past it; the save's manifest is then never written.
        `meta`: extra manifest fields of this save (the library stores the last loss).
        Step 0 is refused: before the first optimizer step there is no training state,
        and `get_state_dict` on a never-stepped AdamW would *create* one (a zero-LR
        step: Adam's `step` 1), so a resume from it diverges (TRAINER-NOTES, issue 15).
        """
        if step < 1:
            raise ValueError(f"refusing to checkpoint step {step}: no optimizer step taken yet")
        self.raise_if_failed()
        if step == self.last_saved_step:
            if blocking:
                self.wait(deadline)
            return
        self.wait(deadline)  # at most one in flight
        name = step_name(step)
        writer = self.store.writer(name, self.threads)
        state = self._state(step, samples_seen)
        t0 = time.perf_counter()
        self.last_saved_step = step
        self._meta[step] = dict(meta or {})
        if self.use_async and not blocking:
            fut = dcp.async_save(
                state, storage_writer=writer, process_group=self.group, async_stager=self._stager
            )
            blocked = time.perf_counter() - t0
            self._inflight, self._inflight_step = fut, step
            fut.add_done_callback(
                lambda f: self._finish(f, step, samples_seen, t0, blocked, writer)
            )
        elif deadline is not None:
            # On a helper thread so the wait can give up at the deadline.
            if self._deadline_pool is None:
                self._deadline_pool = ThreadPoolExecutor(1, "cb-ckpt-deadline")
            fut = self._deadline_pool.submit(
                dcp.save, state, storage_writer=writer, process_group=self.group
            )
            self._inflight, self._inflight_step = fut, step
            fut.add_done_callback(lambda f: self._finish(f, step, samples_seen, t0, 0.0, writer))
            self.wait(deadline)
        else:
            try:
                dcp.save(state, storage_writer=writer, process_group=self.group)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001
                store_down(self.store, exc)  # an outage is StoreUnavailable, not a crash
                raise CheckpointSaveError(
                    f"checkpoint save of step {step} to {self.store.uri(name)} failed: "
                    f"{_one_line(exc)}"
                ) from None
            blocked = time.perf_counter() - t0
            done: Future = Future()
            done.set_result(None)
            self._finish(done, step, samples_seen, t0, blocked, writer)
            self.raise_if_failed()

    def _finish(
        self, fut: Future, step: int, samples_seen: int, t0: float, blocked: float, writer: Any
    ) -> None:
        """Runs when this rank's part is written; rank 0 (DCP coordinator) then commits."""
        try:
            fut.result()
            if self.rank == 0:
                nbytes = self._commit(step, samples_seen, getattr(writer, "file_hashes", {}))
                telemetry.record_span(
                    "checkpoint_save", t0, step=step, bytes=nbytes, blocked_s=blocked
                )
            with self._lock:
                self.last_durable_step = max(self.last_durable_step, step)
            self.stats.append(
                {"step": step, "blocked_s": blocked, "total_s": time.perf_counter() - t0}
            )
            if self.rank == 0 and self.on_durable is not None:
                self.on_durable(step, self.store.uri(step_name(step)))
        except BaseException as exc:  # noqa: BLE001 - surfaced on the training thread
            self._error = exc

    def _commit(self, step: int, samples_seen: int, hashes: dict[str, str]) -> int:
        name = step_name(step)
        # A manifest already there is this step's own earlier commit: the ranks agreed that
        # save failed on an outage after rank 0 had written it, and the step is saved again.
        # A manifest never lists itself; it is rewritten for the files as they are now.
        files = {n: size for n, size in self.store.list_files(name).items() if n != MANIFEST}
        try:
            manifest = manifest_format.build(
                # + this save's loss; "rng" tells a resume each rank saved its generators
                {**self.manifest_base, **self._meta.pop(step, {}), "rng": RNG_PER_RANK},
                step=step,
                samples_seen=samples_seen,
                world_size=self.world_size,
                files=files,
                digests=hashes,
            )
        except manifest_format.ManifestError as exc:
            raise RuntimeError(f"checkpoint {name}: {exc}") from None
        refuse_if_superseded(name)
        self.store.write_manifest(name, manifest)
        self._prune(step)
        return sum(files.values())

    def _prune(self, newest: int) -> None:
        steps = self.store.list_steps()
        complete = sorted(s for s, ok in steps.items() if ok)
        doomed = complete[: -self.keep_last] if len(complete) > self.keep_last else []
        # Incomplete dirs older than the newest commit were abandoned (killed uploads).
        doomed += [s for s, ok in steps.items() if not ok and s < newest]
        for s in doomed:
            self.store.delete(step_name(s))

    def drop_incomplete(self, after_step: int) -> list[int]:
        """Rank 0 at start: delete incomplete step dirs above the resume point.

        They are a previous attempt's saves that never committed; this attempt will
        write those steps again, and stale shard files from a different world size must
        not end up listed in the new manifest. Callers barrier afterwards.
        """
        doomed = [s for s, ok in self.store.list_steps().items() if not ok and s > after_step]
        for s in doomed:
            self.store.delete(step_name(s))
        return doomed

    def wait(self, deadline: float | None = None) -> None:
        """Wait for the in-flight save and its commit; GraceExceeded past `deadline`."""

        def left() -> float | None:
            return None if deadline is None else deadline - time.monotonic()

        fut = self._inflight
        if fut is not None:
            try:
                fut.result(timeout=None if deadline is None else max(0.0, left() or 0.0))
            except FutureTimeout:
                raise GraceExceeded(
                    f"checkpoint of step {self._inflight_step} not durable by the deadline"
                ) from None
            except (Exception, CheckpointException):  # noqa: BLE001 - _finish reports it via _error
                pass
            # the done callback may still be running: wait for its commit too
            while self.last_durable_step < self._inflight_step and self._error is None:
                if deadline is not None and time.monotonic() > deadline:
                    raise GraceExceeded(
                        f"checkpoint of step {self._inflight_step} not committed by the deadline"
                    )
                time.sleep(0.01)
            self._inflight = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            store_down(self.store, err)
            raise CheckpointSaveError(
                f"checkpoint save of step {self._inflight_step} to "
                f"{self.store.uri(step_name(self._inflight_step))} failed: {_one_line(err)}"
            ) from None

    # ------------------------------------------------------------------- load
    def prepare_load(self) -> dict[str, Any]:
        """The state dict DCP loads into (views of the live model/optimizer tensors).

        Why separate: on a never-stepped optimizer `get_state_dict` creates its state
        (`_init_optim_state`: a zero-lr step over every parameter, seconds for the 200m
        model). A make-before-break standby (trainer/standby.py) pays it while it waits
        for the go, so only the bytes are left on the migration's critical path. The
        values are overwritten by the load (AdamW's `step` too), so preparing early
        changes nothing the checkpoint holds."""
        msd, osd = get_state_dict(self.model, self.optim)
        extra: dict[str, Any] = {"step": 0, "samples_seen": 0, "rng": torch.get_rng_state()}
        if self.sched is not None:
            extra["lr_sched"] = self.sched.state_dict()
        if self.user_state is not None:
            extra["user"] = self.user_state()
        self._prepared = {"model": msd, "optim": osd, "trainer": extra}
        return self._prepared

    def _restore_rng(self, extra: dict[str, Any], manifest: dict[str, Any]) -> None:
        """Each rank's own generators when the checkpoint has them (trainer/rng.py); a rank
        the saving run did not have gets fresh per-rank seeds; a checkpoint from before
        per-rank states restores its one torch CPU state on every rank, as it always did."""
        mine = extra.get(rng.PER_RANK_KEY, {}).get(str(self.rank))
        if mine:
            rng.restore(mine)
        elif manifest.get("rng") == RNG_PER_RANK:
            rng.seed_fresh(int(manifest["step"]), self.rank)
        else:
            torch.set_rng_state(extra["rng"])

    def apply_state(self, state: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
        """Put a loaded state (`prepare_load()`'s structure, filled from the store or from
        the in-memory tier) into model, optimizer, scheduler, user state and RNG; returns
        its trainer part. One place, so both tiers restore exactly the same things."""
        set_state_dict(
            self.model,
            self.optim,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(strict=True),
        )
        extra = state["trainer"]
        if self.sched is not None:
            self.sched.load_state_dict(extra["lr_sched"])
        if self.load_user_state is not None:
            self.load_user_state(extra["user"])
        self._restore_rng(extra, manifest)
        return extra

    def load(self, name: str, store: Store | None = None) -> dict[str, Any]:
        """Load checkpoint `name` into model/optim/sched/RNG; returns its manifest.

        Every rank reads the manifest, checks the file list and loads its shards; the
        ranks then agree on the outcome (trainer/agree.py), so a rank that found the
        store down, the checkpoint gone or a file corrupt stops every rank the same way
        instead of leaving its peers in a collective."""
        store = store or self.store
        failure: BaseException | None = None
        manifest: dict[str, Any] = {}
        # Prepared on every rank before any store read, so a rank whose read fails has
        # done the same work (and collectives, if any) as its peers.
        state, self._prepared = self._prepared or self.prepare_load(), None
        try:
            manifest = self._read_manifest(store, name)
            check_compatible(manifest, self.manifest_base["model"], store.uri(name))
            verify_files(store, name, manifest)
        except Exception as exc:  # noqa: BLE001 - agreed below, raised on every rank
            failure = _outage_or(store, exc)
        if failure is None:
            expected = {f["name"]: f for f in manifest.get("files", [])}
            # Ask only for the generator entry this checkpoint has for this rank (a missing
            # key fails DCP's load; the saving world may have been smaller, or predate
            # per-rank RNG).
            saved_world = int(manifest.get("world_size", 0))
            state["trainer"].pop(rng.PER_RANK_KEY, None)
            if manifest.get("rng") == RNG_PER_RANK:
                state["trainer"][rng.PER_RANK_KEY] = rng.load_template(self.rank, saved_world)
            # no_dist: DCP's default load planning is per rank (its global step returns
            # the local plans unchanged), so its two collectives only forward plans and
            # errors; measured at 0.1-0.35 s of a 0.8 s 200m load on 2 ranks. Ranks agree
            # on the outcome with one all_reduce instead (`agree`), so a rank that read a
            # bad file never leaves the others training on.
            try:
                dcp.load(state, storage_reader=store.reader(name, expected), no_dist=True)
            except (Exception, CheckpointException) as exc:  # noqa: BLE001
                try:
                    store_down(store, exc)
                    failure = TrainerError(_load_failure(store.uri(name), exc))
                except StoreUnavailable as down:
                    failure = down
        agree(failure, self.group, self.world_size)
        extra = self.apply_state(state, manifest)
        if int(extra["step"]) != int(manifest["step"]):
            raise TrainerError(
                f"checkpoint {store.uri(name)} is inconsistent: manifest says step "
                f"{manifest['step']}, data says {extra['step']}"
            )
        self.last_durable_step = self.last_saved_step = int(manifest["step"])
        return manifest

    @staticmethod
    def _read_manifest(store: Store, name: str) -> dict[str, Any]:
        try:
            return store.read_manifest(name)
        except Exception as exc:  # noqa: BLE001
            if _not_found(exc):  # pruned between listing and loading: not a config error
                raise ResumeUnavailable(
                    f"checkpoint {store.uri(name)} disappeared before it could be loaded "
                    "(pruned by the attempt that wrote it?)"
                ) from None
            store_down(store, exc)
            raise TrainerError(
                f"checkpoint {store.uri(name)} has no readable {MANIFEST} ({exc}); "
                "it is incomplete or corrupt"
            ) from None


def _outage_or(store: Store, exc: BaseException) -> BaseException:
    """``exc``, or a StoreUnavailable when it means the store is down (store_down)."""
    if isinstance(exc, (StoreUnavailable, TrainerError, ResumeUnavailable)):
        return exc
    try:
        store_down(store, exc)
    except StoreUnavailable as down:
        return down
    return exc


def store_down(store: Store, exc: BaseException) -> None:
    """Raise StoreUnavailable if ``exc`` means the store is down rather than the data
    bad: by checkpoint_layout/faults.py's table, or, when ``exc`` does not say (DCP wraps
    every rank's error in one CheckpointException), by one reachability probe."""
    # DCP's CheckpointException keeps each rank's error in `failures` (rank ->
    # exception or (exception, stack)), outside the __cause__ chain.
    wrapped = [f[0] if isinstance(f, tuple) else f
               for f in (getattr(exc, "failures", None) or {}).values()]
    for e in (exc, *(w for w in wrapped if isinstance(w, BaseException))):
        if is_outage(e):
            raise StoreUnavailable(f"checkpoint store {store.root} is unreachable: "
                                   f"{describe(e)}") from None
    if isinstance(exc, (TrainerError, ResumeUnavailable)):
        return
    try:
        store.check_reachable()
    except TrainerError:
        return  # misconfigured: the caller's own error says more about what failed


def _lines(exc: BaseException) -> list[str]:
    """A CheckpointException (a BaseException) carries every failed rank's traceback;
    the lines of its message, the last of which names what actually went wrong."""
    return [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()] or [
        type(exc).__name__
    ]


def _one_line(exc: BaseException) -> str:
    return _lines(exc)[-1][:600]


def _load_failure(where: str, exc: BaseException) -> str:
    """One line a person can act on, from whatever DCP or the reader raised; a size or
    digest mismatch (ChecksumError, "checkpoint ... is corrupt: ...") is said plainly."""
    lines = _lines(exc)
    bad = next((ln for ln in lines if "is corrupt" in ln and "checkpoint " in ln), "")
    if bad:
        return "could not be loaded: " + bad[bad.index("checkpoint ") :]
    return f"checkpoint {where} could not be loaded (corrupt or incompatible): {lines[-1]}"[:800]


def refuse_if_superseded(name: str) -> None:
    """The agent fences an attempt it replaced by creating ``CB_FENCE_FILE``
    (docs/contracts.md section 1): such an attempt must never commit a checkpoint, or a
    newer attempt could resume from (or be overtaken by) its late writes. Issue 15."""
    fence = os.environ.get("CB_FENCE_FILE", "")
    if fence and os.path.exists(fence):
        raise CheckpointSaveError(
            f"checkpoint {name}: this attempt was superseded ({fence} exists); not committing")


def check_compatible(manifest: dict[str, Any], model_cfg: dict[str, Any], where: str) -> None:
    saved = manifest.get("model")
    if saved != model_cfg:
        diff = {
            k: (saved.get(k) if isinstance(saved, dict) else None, v)
            for k, v in model_cfg.items()
            if not isinstance(saved, dict) or saved.get(k) != v
        }
        raise TrainerError(
            f"checkpoint {where} was written for a different model: "
            + ", ".join(f"{k}: checkpoint {a} vs config {b}" for k, (a, b) in diff.items())
            + ". Resume with the model preset it was trained with, or use a new checkpoint URI."
        )


def verify_files(store: Store, name: str, manifest: dict[str, Any]) -> None:
    """Cheap up-front check: every file the manifest lists exists with its size.

    The digest of each file is checked by the reader as the file is read (shardio.py),
    so content damage of the same size is caught too, without a second read.
    """
    have = store.list_files(name)
    for f in manifest.get("files", []):
        if f["name"] not in have:  # deleted while we looked: pruned, not corrupt
            raise ResumeUnavailable(
                f"checkpoint {store.uri(name)} lost file {f['name']} before it could be "
                "loaded (pruned by the attempt that wrote it?)"
            )
        if have.get(f["name"]) != f["size"]:
            raise TrainerError(
                f"checkpoint {store.uri(name)} is corrupt: file {f['name']} has size "
                f"{have.get(f['name'])} but the manifest says {f['size']}"
            )


def find_resume_point(
    store: Store, resume_from: str, max_concurrency: int
) -> tuple[Store, str] | None:
    """CB_RESUME_FROM if set, else the latest complete checkpoint under the root, else None.

    CB_RESUME_FROM is loaded exactly: the agent already resolved a pruned one to the
    newest complete checkpoint of the same directory (checkpoint_layout.resolve_resume).
    If it is still not complete here, that is ResumeUnavailable (exit 77, relaunched),
    not a configuration error: a malformed URI or an unreachable store still is (exit 2).
    """
    if resume_from:
        parent, name = split_checkpoint_uri(resume_from)
        src = open_store(parent, max_concurrency)
        try:  # the listing is the reachability check on the happy path (a move's downtime)
            steps = src.list_steps()
        except Exception as exc:
            # an outage: StoreUnavailable (the broker waits); a wrong endpoint/bucket: a
            # clear TrainerError (exit 2)
            store_down(src, exc)
            src.check_reachable()
            raise
        if not steps.get(parse_step(name), False):
            state = "incomplete (no manifest)" if parse_step(name) in steps else "gone"
            raise ResumeUnavailable(
                f"CB_RESUME_FROM={resume_from} is not a complete checkpoint: it is {state} "
                f"(no {MANIFEST}); relaunch from the latest complete one"
            )
        return src, name
    try:
        steps = store.list_steps()
    except Exception as exc:
        store_down(store, exc)  # an outage: StoreUnavailable (exit 81), not a crash
        raise
    latest = latest_complete(steps)
    if latest is None:
        return None
    return store, step_name(latest)


def _not_found(exc: BaseException) -> bool:
    """A missing file/object (local or S3), as opposed to one that is there but unreadable."""
    if isinstance(exc, FileNotFoundError):
        return True
    resp = getattr(exc, "response", None)
    if isinstance(resp, dict):
        code = str(resp.get("Error", {}).get("Code", ""))
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return code in {"NoSuchKey", "404"} or status == 404
    return False


def model_manifest_fields(cfg: ModelConfig) -> dict[str, Any]:
    return cfg.to_dict()
