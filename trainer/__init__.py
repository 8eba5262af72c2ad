"""Checkpoint-portable distributed training: a library for your PyTorch script, and
`python -m trainer` (built-in toy models) built on the same library.

    import trainer as cb
    run = cb.init(total_steps=1000)
    model = run.shard(model)
    sampler = cb.ResumableSampler(len(dataset), global_batch=64, seed=0, micro_batch=8)
    ckpt = run.checkpointer(model=model, optimizer=opt, scheduler=sched, data=sampler, every=50)
    for step in range(ckpt.resume() + 1, 1001):
        ...
        run.step_done(step, loss=loss, tokens=tokens)
    run.finish()

Public names (lazily imported, so `python -m trainer` can install its signal handlers
before torch loads): `init`, `Run`, `RunExit`, `ResumableSampler`, `StepBatch`,
`Checkpointer`, `Stateful`, `Parallelism`, `SampleDropout`, `sample_randomness`,
`TrainerError`, `CheckpointSaveError`, and the exit codes. See
docs/user/bring-your-own-code.md, docs/user/randomness.md and docs/contracts.md.

Internals, one job each: config (spec + env), model (built-in LM), data (deterministic
world-size-independent order), sampler (that order for any dataset), parallel (process
group, mesh, FSDP2/HSDP), storage / shardio / shardfile (local dir / S3 for DCP),
checkpoint (DCP save/load, manifest, retention), rng (every generator per rank),
sample_random (world-size-independent dropout), checkpointer (what a script registers),
progress (file for the agent), signals (SIGTERM/SIGUSR1 agreement), run (the public
loop hooks), loop (the built-in trainer on top of run).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "init": "trainer.run",
    "Run": "trainer.run",
    "RunExit": "trainer.run",
    "ResumableSampler": "trainer.sampler",
    "StepBatch": "trainer.sampler",
    "SampleDropout": "trainer.sample_random",
    "sample_randomness": "trainer.sample_random",
    "Checkpointer": "trainer.checkpointer",
    "Stateful": "trainer.checkpointer",
    "Parallelism": "trainer.parallel",
    "TrainerError": "trainer.errors",
    "CheckpointSaveError": "trainer.errors",
    "EXIT_OK": "trainer.errors",
    "EXIT_BAD_CONFIG": "trainer.errors",
    "EXIT_CHECKPOINTED": "trainer.errors",
    "EXIT_GRACE_EXCEEDED": "trainer.errors",
    "EXIT_RESUME_UNAVAILABLE": "trainer.errors",
    "ResumeUnavailable": "trainer.errors",
}
__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_CHECKPOINTED",
    "EXIT_GRACE_EXCEEDED",
    "EXIT_OK",
    "EXIT_RESUME_UNAVAILABLE",
    "CheckpointSaveError",
    "Checkpointer",
    "Parallelism",
    "ResumableSampler",
    "ResumeUnavailable",
    "Run",
    "RunExit",
    "SampleDropout",
    "Stateful",
    "StepBatch",
    "TrainerError",
    "init",
    "sample_randomness",
]

if TYPE_CHECKING:
    from trainer.checkpointer import Checkpointer, Stateful
    from trainer.errors import (
        EXIT_BAD_CONFIG,
        EXIT_CHECKPOINTED,
        EXIT_GRACE_EXCEEDED,
        EXIT_OK,
        EXIT_RESUME_UNAVAILABLE,
        CheckpointSaveError,
        ResumeUnavailable,
        TrainerError,
    )
    from trainer.parallel import Parallelism
    from trainer.run import Run, RunExit, init
    from trainer.sample_random import SampleDropout, sample_randomness
    from trainer.sampler import ResumableSampler, StepBatch


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
