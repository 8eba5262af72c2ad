"""Every job option (``TrainerSpec.options``): one table, checked at submit, read by all.

Why one table: the options map is ``map<string,string>`` and each reader (the built-in
trainer, the broker's recovery policy, the local and Kubernetes executors) used to parse
its own keys its own way, leniently: ``memory_every: "2x"`` or ``"-1"`` silently turned
the memory tier off, ``warm_ranks: "off"`` kept warm starters on, a typo in a key was
ignored by every executor, and the built-in trainer refused the executors' options
(``hang_timeout_s``) after a placement and a launch. Now :data:`OPTIONS` says each
option's type, allowed values, default and meaning; the broker refuses a bad one at
SubmitJob (INVALID_ARGUMENT naming the option, the value and what is allowed), and every
reader gets its value through :func:`value` (or :func:`parse`), so all agree.

The set is closed: an unknown key is refused (with a did-you-mean). Options are read
only by this project's components; a user's own program takes its settings through its
``run`` arguments and ``env``. So an unknown key is a typo, or an option a newer
component knows and this broker does not (then it is refused rather than ignored).

Standard library only: the trainer (in the job's image) and the agents import it.
docs/reference/job-spec.md's options table is generated from :data:`OPTIONS`
(``scripts/gen_docs.py``).
"""

from __future__ import annotations

import difflib
import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_STEPS = 2**53  # a step count, exact in a float (broker/api/limits.py)
INT32_MAX = 2**31 - 1
YEAR_S = 366 * 86_400.0
log = logging.getLogger(__name__)


class Kind(enum.Enum):
    """How an option's text is read."""

    INT = "integer"
    FLOAT = "number"
    BOOL = "boolean"
    CHOICE = "one of"
    TEXT = "text"


class Reader(enum.Enum):
    """Who reads an option (the docs' "read by" column)."""

    TRAINER = "built-in trainer"
    BROKER = "broker"
    LOCAL = "local executor"
    K8S = "Kubernetes executor"


def _num(x: float) -> str:
    """A bound as people read it: ``9,007,199,254,740,992``, ``0.5``."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class Option:
    """One option: its type, its allowed range or values, its default, who reads it."""

    name: str
    kind: Kind
    default: Any  # None: the reader's own setting (e.g. the agent's --hang-timeout-s)
    doc: str
    readers: frozenset[Reader]
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself is not allowed (> lo)
    choices: tuple[str, ...] = ()

    def allowed(self) -> str:
        """What is allowed, for error messages and the docs."""
        if self.kind is Kind.BOOL:
            return "true or false (also 1/0, yes/no, on/off)"
        if self.kind is Kind.CHOICE:
            return "one of " + ", ".join(self.choices)
        if self.kind is Kind.TEXT:
            return "any text"
        what = "an integer" if self.kind is Kind.INT else "a finite number"
        lo = None if self.lo is None else _num(self.lo)
        hi = None if self.hi is None else _num(self.hi)
        if lo is not None and hi is not None:
            return f"{what} above {lo} and at most {hi}" if self.lo_open else f"{what} from {lo} to {hi}"
        if lo is not None:
            return f"{what} above {lo}" if self.lo_open else f"{what} from {lo}"
        return what if hi is None else f"{what} of at most {hi}"

    def parse(self, raw: str) -> Any:
        """The typed value of ``raw``; :class:`OptionError` when it is not allowed."""
        text = raw.strip()
        if self.kind is Kind.TEXT:
            return raw
        if self.kind is Kind.BOOL:
            low = text.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise OptionError(self, raw)
        if self.kind is Kind.CHOICE:
            if text not in self.choices:
                raise OptionError(self, raw)
            return text
        try:
            number: float = int(text, 10) if self.kind is Kind.INT else float(text)
        except ValueError:
            raise OptionError(self, raw) from None
        if not math.isfinite(number):
            raise OptionError(self, raw)
        if self.lo is not None and (number < self.lo or (self.lo_open and number == self.lo)):
            raise OptionError(self, raw)
        if self.hi is not None and number > self.hi:
            raise OptionError(self, raw)
        return number


class OptionError(ValueError):
    """A job option that is unknown or whose value is not allowed; the message names the
    option, the value and what is allowed."""

    def __init__(self, option: Option | None, raw: str, name: str = "") -> None:
        self.option, self.raw = option, raw
        self.name = option.name if option is not None else name
        shown = repr(raw) if len(raw) <= 60 else repr(raw[:60]) + f"... ({len(raw)} chars)"
        if option is None:
            near = difflib.get_close_matches(name, list(OPTIONS), n=1, cutoff=0.6)
            hint = f"did you mean {near[0]!r}? " if near else ""
            super().__init__(f"trainer option {name!r} is unknown; {hint}known options: "
                             + ", ".join(sorted(OPTIONS)))
        else:
            super().__init__(f"trainer option {option.name} = {shown} is not allowed:"
                             f" {option.allowed()}")


_ALL_EXECUTORS = frozenset({Reader.LOCAL, Reader.K8S})
_T = frozenset({Reader.TRAINER})

# The table, as data (docs/reference/job-spec.md, "Trainer options", is generated from it).
OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("keep_last", Kind.INT, 3, "complete checkpoints to keep", _T, lo=1, hi=10_000),
    Option("micro_batch_size", Kind.INT, 8,
           "samples per forward pass per rank; more = gradient accumulation", _T,
           lo=1, hi=INT32_MAX),
    Option("parallelism", Kind.CHOICE, "fsdp", "how ranks share the model", _T,
           choices=("fsdp", "hsdp")),
    Option("hsdp_replicate", Kind.INT, 2, "replica groups of the HSDP mesh", _T, lo=1, hi=10_000),
    Option("mixed_precision", Kind.CHOICE, "none", "parameter and reduction precision", _T,
           choices=("none", "bf16")),
    Option("activation_checkpointing", Kind.BOOL, False,
           "recompute activations in the backward pass (less memory)", _T),
    Option("async_checkpoint", Kind.BOOL, True, "save periodic checkpoints in the background", _T),
    Option("sample_log", Kind.TEXT, "", "rank 0 appends one JSON line per step to this file", _T),
    Option("lr", Kind.FLOAT, 1e-3, "AdamW learning rate", _T, lo=0, lo_open=True, hi=1e6),
    Option("warmup_steps", Kind.INT, 5, "linear warmup steps before the cosine decay", _T,
           lo=0, hi=MAX_STEPS),
    Option("weight_decay", Kind.FLOAT, 0.0, "AdamW weight decay", _T, lo=0, hi=1e6),
    Option("seq_len", Kind.INT, 0, "override the model preset's sequence length (0 = keep)", _T,
           lo=0, hi=INT32_MAX),
    Option("dataset_size", Kind.INT, 65536, "samples per epoch", _T, lo=1, hi=MAX_STEPS),
    Option("heartbeat_s", Kind.FLOAT, 2.0, "seconds between the ranks' progress heartbeats", _T,
           lo=0, lo_open=True, hi=86_400),
    Option("stop_at_step", Kind.INT, 0,
           "stop the attempt after this step with a checkpoint, exit 75 (0 = never)", _T,
           lo=0, hi=MAX_STEPS),
    Option("storage_threads", Kind.INT, 2, "big-shard files (and writer threads) per rank", _T,
           lo=1, hi=64),
    Option("s3_max_concurrency", Kind.INT, 8, "S3 parts in flight per file", _T, lo=1, hi=64),
    Option("dist_timeout_s", Kind.FLOAT, 300.0, "collective timeout of the process group", _T,
           lo=0, lo_open=True, hi=YEAR_S),
    Option("log_every", Kind.INT, 10, "steps between the trainer's log lines", _T,
           lo=1, hi=MAX_STEPS),
    Option("memory_every", Kind.INT, 0,
           "in-memory recovery tier: a keeper per node and a snapshot every K steps (0 = off;"
           " docs/recovery.md)", _T | _ALL_EXECUTORS | {Reader.BROKER}, lo=0, hi=MAX_STEPS),
    Option("memory_keep", Kind.INT, 2,
           "in-memory tier: steps each keeper holds per rank (1 halves the keepers' memory;"
           " a node lost mid-send then recovers from the store)", _ALL_EXECUTORS, lo=1, hi=16),
    Option("warm_ranks", Kind.BOOL, True,
           "with the memory tier, relaunched ranks fork from a warm starter per node"
           " (false = always spawn)", frozenset({Reader.LOCAL})),
    Option("hang_timeout_s", Kind.FLOAT, None,
           "no progress heartbeat for this long: the attempt is hung (0 = never; default:"
           " the agent's hang_timeout_s)", _ALL_EXECUTORS, lo=0, hi=YEAR_S),
    Option("startup_timeout_s", Kind.FLOAT, None,
           "a command with no progress file counts as running after this long (0 = it has"
           " the progress contract, never assume; default: the agent's starting grace)",
           frozenset({Reader.LOCAL}), lo=0, hi=YEAR_S),
    Option("memory_snapshot_mb", Kind.FLOAT, 0.0,
           "declared size of one rank's memory snapshot, MB: sizes the keeper pods' memory"
           " before the ranks report it (0 = not declared)", frozenset({Reader.K8S}),
           lo=0, hi=10_000_000),
)}


def parse(options: Mapping[str, str], reader: Reader | None = None) -> dict[str, Any]:
    """Every option in ``options`` typed (defaults not filled in); :class:`OptionError` on
    the first unknown key or bad value. ``reader``: keep only the options it reads."""
    out: dict[str, Any] = {}
    for name in sorted(options):
        opt = OPTIONS.get(name)
        if opt is None:
            raise OptionError(None, options[name], name=name)
        typed = opt.parse(options[name])
        if reader is None or reader in opt.readers:
            out[name] = typed
    return out


def value(options: Mapping[str, str], name: str, default: Any = None, *, strict: bool = True) -> Any:
    """The typed value of option ``name`` in ``options``: its table default when absent
    (or ``default`` when the table's is None: the reader's own setting). A bad value
    raises :class:`OptionError`; ``strict=False`` logs it and gives the default instead,
    for readers that must not fail on a job whose spec was stored before submit checked
    its options (the scheduler's pass, an agent's poll or adoption): SubmitJob is where a
    bad option is refused."""
    opt = OPTIONS[name]
    fallback = opt.default if opt.default is not None else default
    raw = options.get(name)
    if raw is None:
        return fallback
    try:
        return opt.parse(raw)
    except OptionError as e:
        if strict:
            raise
        log.warning("%s: using %r", e, fallback)
        return fallback
