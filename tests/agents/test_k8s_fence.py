"""The fence's rules (region_agents/executors/k8s_fence.py): when a held Launch may go.
The fence on the real API server (an adopted attempt killed and awaited before attempt
2's pods exist) is tests/k8s/test_executor_restart.py."""

from __future__ import annotations

import threading
import time

from region_agents.executors.k8s_fence import Fence, Fences, FenceWait


def _wait(ev: threading.Event, what: str) -> None:
    assert ev.wait(10), what


def test_a_launch_goes_only_once_every_older_pod_has_ended() -> None:
    cache: dict[str, dict] = {"old-0": {"ended": False}, "old-1": {"ended": False}}
    fences = Fences(cache.get, lambda p: p["ended"])
    went, gave_up = threading.Event(), threading.Event()
    fences.add(Fence("j attempt 2", [FenceWait("old-0"), FenceWait("old-1")], go=went.set,
                     give_up=gave_up.set, timeout_s=60))
    try:
        time.sleep(0.3)
        assert not went.is_set() and fences.pending() == 1  # both still run
        cache["old-0"] = {"ended": True}
        time.sleep(0.3)
        assert not went.is_set()  # one still runs
        del cache["old-1"]  # seen, then deleted: its end was read (finalizer released)
        _wait(went, "the launch to go")
        assert not gave_up.is_set() and fences.pending() == 0
    finally:
        fences.stop()


def test_a_pod_still_being_made_is_waited_for_and_one_never_made_is_not() -> None:
    cache: dict[str, dict] = {}
    fences = Fences(cache.get, lambda p: p["ended"])
    state = {"done": False, "made": {"old-0"}}  # the older attempt's creator is running
    went = threading.Event()
    waits = [FenceWait(n, lambda n=n: (state["done"], n in state["made"]))
             for n in ("old-0", "old-1")]
    fences.add(Fence("j attempt 2", waits, go=went.set, give_up=lambda: None, timeout_s=60))
    try:
        time.sleep(0.3)
        assert not went.is_set()  # its creation is not over
        state["done"] = True
        time.sleep(0.3)
        assert not went.is_set()  # old-0 was made and the cache has not shown it yet
        cache["old-0"] = {"ended": False}
        time.sleep(0.3)
        assert not went.is_set()
        cache["old-0"] = {"ended": True}  # old-1 was never made: nothing to wait for
        _wait(went, "the launch to go")
    finally:
        fences.stop()


def test_a_fence_that_never_clears_gives_up_after_its_timeout() -> None:
    fences = Fences({"old-0": {"ended": False}}.get, lambda p: p["ended"])
    went, gave_up = threading.Event(), threading.Event()
    fences.add(Fence("j attempt 2", [FenceWait("old-0")], go=went.set, give_up=gave_up.set,
                     timeout_s=0.3))
    try:
        _wait(gave_up, "the fence to give up")
        assert not went.is_set() and fences.pending() == 0
    finally:
        fences.stop()
