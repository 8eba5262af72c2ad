"""Trainer configuration: the `TrainerSpec` JSON in `CB_TRAINER_CONFIG` plus the env.

Why pydantic for the spec: the JSON comes from another component (the agent copies the
job's `TrainerSpec`), possibly through protobuf's JSON mapping, where int64 fields arrive
as strings and names may be camelCase. Pydantic coerces both and gives a precise
message for anything else, which we turn into exit code 2 (docs/contracts.md).

`options` is a `map<string,string>` in the proto, so every option value may arrive as a
string; `TrainerOptions` parses them through the one options table
(checkpoint_layout/job_options.py) and rejects unknown keys (a typo such as `keep_lats`
should fail loudly, not be silently ignored; the broker already refuses it at submit).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from checkpoint_layout import job_options
from trainer.errors import TrainerError


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer LM. Stored in every manifest to refuse a mismatched resume."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# "tiny": a few thousand parameters, for tests and demos (a step is milliseconds on CPU).
# "small": a few million, for demos that want a visible loss curve.
# "200m": >= 200M parameters, for the checkpoint benchmark.
MODEL_PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=16),
    "small": ModelConfig(vocab_size=1024, d_model=128, n_layers=4, n_heads=4, d_ff=512, seq_len=64),
    "200m": ModelConfig(
        vocab_size=32000, d_model=1024, n_layers=15, n_heads=16, d_ff=4096, seq_len=128
    ),
}


def _default(name: str) -> Any:
    return job_options.OPTIONS[name].default


class TrainerOptions(BaseModel):
    """`TrainerSpec.options`, typed, for the built-in trainer. Which options exist, their
    types, ranges and defaults are one table, `checkpoint_layout/job_options.py` (the
    broker checks it at submit; the agents read their options through it too): an
    unknown key or a bad value is an error here as well (exit 2), and options only the
    agents read (``hang_timeout_s``, ``warm_ranks``, ...) are accepted and ignored.
    The fields below are the trainer's own rows; a test keeps them equal to the table."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    keep_last: int = _default("keep_last")
    micro_batch_size: int = _default("micro_batch_size")
    parallelism: Literal["fsdp", "hsdp"] = _default("parallelism")
    hsdp_replicate: int = _default("hsdp_replicate")
    mixed_precision: Literal["none", "bf16"] = _default("mixed_precision")
    activation_checkpointing: bool = _default("activation_checkpointing")
    async_checkpoint: bool = _default("async_checkpoint")
    sample_log: str = _default("sample_log")
    lr: float = _default("lr")
    warmup_steps: int = _default("warmup_steps")
    weight_decay: float = _default("weight_decay")
    seq_len: int = _default("seq_len")
    dataset_size: int = _default("dataset_size")
    heartbeat_s: float = _default("heartbeat_s")
    stop_at_step: int = _default("stop_at_step")
    storage_threads: int = _default("storage_threads")
    s3_max_concurrency: int = _default("s3_max_concurrency")
    dist_timeout_s: float = _default("dist_timeout_s")
    log_every: int = _default("log_every")
    memory_every: int = _default("memory_every")

    @model_validator(mode="before")
    @classmethod
    def _by_the_table(cls, raw: Any) -> Any:
        """Strings (the proto map) are parsed by the table; a value already typed (a
        test's dict, a TrainerOptions) is checked by the table through its text."""
        if isinstance(raw, TrainerOptions):
            return raw.model_dump()
        if not isinstance(raw, dict):
            return raw
        text = {str(k): _as_text(v) for k, v in raw.items()}
        return job_options.parse(text, reader=job_options.Reader.TRAINER)


def _as_text(v: Any) -> str:
    """How a value travels in the proto's map<string,string> (``True`` -> ``true``)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


class TrainerSpec(BaseModel):
    """The `TrainerSpec` of proto/computebroker/v1/common.proto, as JSON."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    total_steps: int = Field(..., ge=1, alias="totalSteps")
    checkpoint_every: int = Field(0, ge=0, alias="checkpointEvery")
    global_batch_size: int = Field(..., ge=1, alias="globalBatchSize")
    seed: int = 0
    model: str = "tiny"
    step_sleep_s: float = Field(0.0, ge=0, alias="stepSleepS")
    options: TrainerOptions = Field(default_factory=TrainerOptions)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        if v not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {v!r}; known: {sorted(MODEL_PRESETS)}")
        return v

    def model_shape(self) -> ModelConfig:
        base = MODEL_PRESETS[self.model]
        if self.options.seq_len:
            return dataclasses.replace(base, seq_len=self.options.seq_len)
        return base


@dataclasses.dataclass(frozen=True)
class RunEnv:
    """What the launcher (agent or torchrun) tells this process, read once at start."""

    rank: int
    world_size: int
    local_rank: int
    job_id: str
    attempt: int
    checkpoint_uri: str
    resume_from: str
    progress_file: str
    grace_s: float
    # CB_STORE_WAIT_S: how long the ranks may wait together, in the attempt, for a
    # checkpoint store that is down while they resume, before exiting 81 and leaving the
    # rest of the wait to the broker (trainer/checkpointer.py). 0 = exit at once.
    store_wait_s: float = 0.0


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise TrainerError(f"environment variable {name}={raw!r} is not an integer") from None


def load_run_env(env: dict[str, str] | None = None, default_checkpoint_uri: str = "") -> RunEnv:
    """Read RANK/WORLD_SIZE/CB_* (docs/contracts.md section 1). Missing RANK = single process.

    `default_checkpoint_uri` is used when CB_CHECKPOINT_URI is unset (a library user's
    script run by hand); `python -m trainer` passes none, so it still requires the variable.
    A relative local path is made absolute here, once, so every later use agrees on it.
    """
    env = dict(os.environ if env is None else env)
    rank = _int_env(env, "RANK", 0)
    world = _int_env(env, "WORLD_SIZE", 1)
    if world < 1 or not 0 <= rank < world:
        raise TrainerError(f"RANK={rank} / WORLD_SIZE={world} are inconsistent")
    ckpt = env.get("CB_CHECKPOINT_URI", "") or default_checkpoint_uri
    if ckpt and "://" not in ckpt:
        ckpt = os.path.abspath(ckpt)
    if not ckpt:
        raise TrainerError(
            "CB_CHECKPOINT_URI is not set: the trainer needs a local directory or an "
            "s3://bucket/prefix to write checkpoints to"
        )
    try:
        grace = float(env.get("CB_GRACE_S", "") or 120)
    except ValueError:
        raise TrainerError(f"CB_GRACE_S={env['CB_GRACE_S']!r} is not a number") from None
    try:
        store_wait = max(0.0, float(env.get("CB_STORE_WAIT_S", "") or 0))
    except ValueError:
        raise TrainerError(f"CB_STORE_WAIT_S={env['CB_STORE_WAIT_S']!r} is not a number") from None
    return RunEnv(
        rank=rank,
        world_size=world,
        local_rank=_int_env(env, "LOCAL_RANK", rank),
        job_id=env.get("CB_JOB_ID", "") or "local",
        attempt=_int_env(env, "CB_ATTEMPT", 0),
        checkpoint_uri=ckpt,
        resume_from=env.get("CB_RESUME_FROM", ""),
        progress_file=env.get("CB_PROGRESS_FILE", ""),
        grace_s=grace,
        store_wait_s=store_wait,
    )


def parse_spec(raw: str | dict[str, Any]) -> TrainerSpec:
    """Parse and validate `CB_TRAINER_CONFIG`; any problem becomes one readable TrainerError."""
    if isinstance(raw, str):
        if not raw.strip():
            raise TrainerError("CB_TRAINER_CONFIG is empty: it must be a TrainerSpec JSON object")
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TrainerError(f"CB_TRAINER_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise TrainerError("CB_TRAINER_CONFIG must be a JSON object")
    try:
        return TrainerSpec.model_validate(raw)
    except ValidationError as exc:
        names = {f.alias: n for n, f in TrainerSpec.model_fields.items() if f.alias}
        problems = "; ".join(
            f"{'.'.join(names.get(str(p), str(p)) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()
        )
        raise TrainerError(f"invalid CB_TRAINER_CONFIG: {problems}") from None
