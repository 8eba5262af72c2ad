"""Priority classes as stored state, against both stores (SQLite and Redis).

broker/jobs/priority_classes.py keeps the live set as the config's defaults overlaid by
records of its own kinds; these tests pin what the broker relies on: the store wins
over config, a deletion survives a restart (tombstone), a replaced leader's late write
is fenced, a class live jobs use cannot be deleted."""

from __future__ import annotations

import threading
import time

import pytest

from broker.api.errors import FailedPrecondition, NotFound
from broker.config import BrokerConfig
from broker.jobs.priority_classes import PriorityClasses
from broker.store import Store
from broker.store.base import Fenced, StoreError
from broker.store.sqlite import SQLiteStore
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

CONFIG = BrokerConfig(priority_classes={"high": 100, "training": 10, "low": 1},
                      default_priority_class="training")


def _job(job_id: str, cls: str, phase: int = pb.JOB_PHASE_PENDING) -> pb.Job:
    return pb.Job(id=job_id, phase=phase, spec=pb.JobSpec(name=job_id, team="ml", priority_class=cls))


def test_config_seeds_then_the_store_wins_across_restarts(store_factory) -> None:
    first = PriorityClasses(store_factory(), CONFIG)
    assert first.values() == {"high": 100, "training": 10, "low": 1}
    assert [pc.name for pc in first.list()] == ["high", "training", "low"]
    assert [pc.is_default for pc in first.list()] == [False, True, False]
    got = first.set(cpb.PriorityClass(name="urgent", value=1000, description="pager duty"))
    assert got == cpb.PriorityClass(name="urgent", value=1000, description="pager duty")
    first.set(cpb.PriorityClass(name="low", value=-5))  # overrides the config value
    first.delete("high")
    assert first.values() == {"urgent": 1000, "training": 10, "low": -5}
    # A restarted broker (new store object, same data, same config) sees the same set:
    # the deleted config class stays deleted, the changed one keeps its stored value.
    again = PriorityClasses(store_factory(), CONFIG)
    assert again.values() == {"urgent": 1000, "training": 10, "low": -5}
    assert again.value_of("") == 10 and again.value_of("urgent") == 1000
    assert again.value_of("high") == 0  # gone: no rank
    again.set(cpb.PriorityClass(name="high", value=50))  # re-created through the API
    assert PriorityClasses(store_factory(), CONFIG).values()["high"] == 50


def test_delete_refuses_live_users_the_default_and_unknown(store: Store) -> None:
    classes = PriorityClasses(store, CONFIG)
    store.create_job(_job("j1", "high"))
    store.create_job(_job("j2", "high", pb.JOB_PHASE_RUNNING))
    store.create_job(_job("j3", "high", pb.JOB_PHASE_SUCCEEDED))  # ended: does not count
    with pytest.raises(FailedPrecondition, match="used by 2 live job"):
        classes.delete("high")
    with pytest.raises(FailedPrecondition, match="default"):
        classes.delete("training")
    with pytest.raises(NotFound, match="known: high, training, low"):
        classes.delete("nope")
    assert classes.values()["high"] == 100
    classes.delete("low")  # nobody uses it
    assert "low" not in classes.values()


def test_a_replaced_leaders_class_writes_are_fenced(store_factory) -> None:
    old, new = store_factory(), store_factory()
    old.fence_writes("leader", old.acquire_lease_epoch("leader", "old", ttl_s=0.3))
    PriorityClasses(old, CONFIG).set(cpb.PriorityClass(name="mine", value=7))
    deadline = time.monotonic() + 30
    while not (epoch := new.acquire_lease_epoch("leader", "new", ttl_s=30)):
        assert time.monotonic() < deadline, "lease never expired"
        time.sleep(0.05)
    new.fence_writes("leader", epoch)
    stale = PriorityClasses(old, CONFIG)
    with pytest.raises(Fenced):
        stale.set(cpb.PriorityClass(name="mine", value=9999))
    with pytest.raises(Fenced):
        stale.delete("mine")
    assert PriorityClasses(new, CONFIG).values()["mine"] == 7


def test_the_cache_refreshes_on_change_and_after_its_interval(store_factory) -> None:
    now = [0.0]
    reader = PriorityClasses(store_factory(), CONFIG, clock=lambda: now[0])
    writer = PriorityClasses(store_factory(), CONFIG)
    assert reader.value_of("high") == 100
    writer.set(cpb.PriorityClass(name="high", value=3))  # another replica's write
    assert reader.value_of("high") == 100  # cached until the interval passes
    now[0] += 60
    assert reader.value_of("high") == 3


def test_a_failed_periodic_refresh_keeps_the_last_set(tmp_path) -> None:  # noqa: ANN001
    """SQLite only: a closed SQLite store refuses reads (StoreError); a closed Redis client
    just reconnects, so it cannot stand for an unreachable store here."""
    store = SQLiteStore(str(tmp_path / "b.sqlite"))
    now = [0.0]
    classes = PriorityClasses(store, CONFIG, clock=lambda: now[0])
    classes.set(cpb.PriorityClass(name="kept", value=42))
    store.close()  # every read now fails
    with pytest.raises(StoreError):
        store.list_records("priority-class", cpb.PriorityClass)
    now[0] += 60
    assert classes.value_of("kept") == 42


def test_a_delete_waits_for_a_submit_in_flight_and_counts_its_job(store: Store) -> None:
    """A submit validated against the old set holds the class until its job is stored:
    the delete waiting meanwhile then sees that job and refuses."""
    classes = PriorityClasses(store, CONFIG)
    outcome: list[BaseException | None] = []

    def delete() -> None:
        try:
            classes.delete("low")
            outcome.append(None)
        except FailedPrecondition as e:
            outcome.append(e)

    with classes.submitting():  # a submit that validated "low" ...
        t = threading.Thread(target=delete)
        t.start()
        deadline = time.monotonic() + 30
        while classes.guard.waiting_exclusive != 1:  # ... while the delete is waiting
            assert time.monotonic() < deadline, "delete never started waiting"
            time.sleep(0.01)
        store.create_job(_job("in-flight", "low"))  # ... stores its job
    t.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], FailedPrecondition)
    assert "used by 1 live job" in str(outcome[0]) and classes.values()["low"] == 1
