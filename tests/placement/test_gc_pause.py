"""A placement pass pauses the cyclic garbage collector and always puts it back as it was."""

from __future__ import annotations

import gc

import pytest

from placement.gc_pause import gc_paused
from placement.scheduler import schedule
from tests.placement.helpers import job, node, snap


@pytest.fixture(autouse=True)
def _collector_enabled():  # noqa: ANN202
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_restored_after_even_when_nested_or_failing() -> None:
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # only the outermost pause turns it back on
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("a failing pass")
    assert gc.isenabled()


def test_a_collector_the_caller_disabled_stays_disabled() -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_schedule_leaves_the_collector_on() -> None:
    d = schedule(snap([node(0)], pending=[job("a", gpus=4)]))
    assert [a.job_id for a in d.admissions] == ["a"]
    assert gc.isenabled()
