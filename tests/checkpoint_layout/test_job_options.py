"""The one table of job options (checkpoint_layout/job_options.py), row by row.

Every row refuses the same hostile values (nan, inf, 1e400, a negative number, the
wrong type, empty text) unless its type allows them, and accepts its default; an
unknown name is refused with a did-you-mean. The built-in trainer's typed options are
the table's trainer rows (names and defaults), and every reader gets the table's value.
"""

from __future__ import annotations

import pytest

from checkpoint_layout import job_options
from checkpoint_layout.job_options import OPTIONS, Kind, OptionError, Reader
from region_agents.executors.k8s_keepers import snapshot_bound
from region_agents.executors.memory_keepers import memory_every
from trainer.config import TrainerOptions, parse_spec

HOSTILE = ("nan", "inf", "-inf", "1e400", "-1", "", "abc", "[1]", "2.5")


def _text(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_row_refuses_bad_values_and_names_them(name: str) -> None:
    opt = OPTIONS[name]
    if opt.kind is Kind.TEXT:
        assert opt.parse("anything at all") == "anything at all"
        return
    for raw in HOSTILE:
        if opt.kind is Kind.FLOAT and raw == "2.5" and (opt.hi is None or opt.hi >= 2.5):
            continue  # a fraction is a fine number
        if opt.kind is Kind.FLOAT and raw == "-1" and opt.lo is None:
            continue
        with pytest.raises(OptionError) as e:
            job_options.parse({name: raw})
        msg = str(e.value)
        assert name in msg and repr(raw) in msg and opt.allowed() in msg, msg
    if opt.hi is not None:
        with pytest.raises(OptionError):
            opt.parse(str(int(opt.hi) + 1))
    if opt.lo is not None and opt.lo_open:
        with pytest.raises(OptionError):
            opt.parse(str(opt.lo))
    if opt.default is not None:  # the default is allowed (as its text)
        assert opt.parse(_text(opt.default)) == opt.default
    assert opt.readers, name


def test_unknown_option_is_refused_with_a_hint() -> None:
    with pytest.raises(OptionError, match="'memory_evry' is unknown; did you mean 'memory_every'"):
        job_options.parse({"memory_evry": "1"})


def test_booleans_and_choices() -> None:
    assert job_options.value({"warm_ranks": "0"}, "warm_ranks") is False
    assert job_options.value({"warm_ranks": "True"}, "warm_ranks") is True
    assert job_options.value({}, "warm_ranks") is True
    with pytest.raises(OptionError, match="warm_ranks = 'off-ish'"):
        job_options.value({"warm_ranks": "off-ish"}, "warm_ranks")
    with pytest.raises(OptionError, match="one of fsdp, hsdp"):
        job_options.parse({"parallelism": "ddp"})


def test_trainer_options_are_the_table_rows() -> None:
    rows = {n: o.default for n, o in OPTIONS.items() if Reader.TRAINER in o.readers}
    fields = {n: f.default for n, f in TrainerOptions.model_fields.items()}
    assert fields == rows


def test_trainer_reads_through_the_table() -> None:
    spec = parse_spec({"total_steps": 5, "global_batch_size": 4,
                       "options": {"keep_last": "2", "hang_timeout_s": "30", "warm_ranks": "0",
                                   "async_checkpoint": "false", "lr": "1e-4"}})
    o = spec.options
    assert (o.keep_last, o.async_checkpoint, o.lr) == (2, False, 1e-4)
    for bad in ({"keep_lats": "2"}, {"lr": "nan"}, {"memory_every": "1e400"}):
        with pytest.raises(Exception, match=next(iter(bad))):
            parse_spec({"total_steps": 5, "global_batch_size": 4, "options": bad})


def test_agent_readers_use_the_table() -> None:
    assert memory_every({"memory_every": "3"}) == 3
    assert memory_every({"memory_every": "-1"}) == 0  # stored before submit checked it
    assert snapshot_bound({"memory_snapshot_mb": "2.5"}, 0) == 2_500_000
    assert snapshot_bound({"memory_snapshot_mb": "inf"}, 7) == 7
    assert job_options.value({}, "hang_timeout_s", 600.0) == 600.0
    assert job_options.value({"hang_timeout_s": "bad"}, "hang_timeout_s", 600.0, strict=False) == 600.0
