"""The watch hub's per-job counters stay bounded over a broker's life, and a watcher
whose job's counter was dropped still wakes on that job's next write."""

from __future__ import annotations

import threading

from broker.jobs import hub as hub_mod
from broker.jobs.hub import EventHub


def test_counters_are_bounded_and_a_dropped_counter_never_repeats_a_value(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(hub_mod, "MAX_COUNTERS", 50)
    hub = EventHub()
    hub.notify("old")
    seen_old = hub.counter("old")
    for i in range(500):
        hub.notify(f"job-{i}")
    assert len(hub._counters) <= 50  # noqa: SLF001 -- the bound is the point of the test
    # "old" was dropped: its counter now reads a value it never showed before
    assert hub.counter("old") != seen_old
    seen = hub.counter("old")
    hub.notify("old")
    assert hub.counter("old") == seen + 1


def test_a_waiter_keeps_its_counter_and_wakes_through_a_drop(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(hub_mod, "MAX_COUNTERS", 10)
    hub = EventHub()
    seen = hub.counter("watched")
    woke: list[int] = []
    t = threading.Thread(target=lambda: woke.append(hub.wait("watched", seen, 10.0)))
    t.start()
    while "watched" not in hub._conds:  # noqa: SLF001 -- wait until it sleeps
        pass
    for i in range(100):  # drops happen while it waits
        hub.notify(f"other-{i}")
    assert t.is_alive()  # other jobs' writes do not wake it
    hub.notify("watched")
    t.join(5)
    assert woke and woke[0] != seen
