"""Group commit for callers on an event loop (the API workers' grpc.aio server):
``GroupWriter.submit_soon`` never blocks the loop, shares groups with thread callers,
and keeps each member's own result or error."""

from __future__ import annotations

import asyncio
import threading
import time

from broker.store import AlreadyExists, Store
from broker.store.base import Fenced, StoreError
from broker.store.group_commit import GroupCommit, LoopSink
from computebroker.v1 import common_pb2 as pb
from tests.store.test_conformance import ev, make_job


class _SlowStore:
    """The real store, each create_jobs held for ``delay`` s first (a slow disk)."""

    def __init__(self, store: Store, delay: float) -> None:
        self._store, self.delay = store, delay
        self.sizes: list[int] = []

    def create_jobs(self, items):  # noqa: ANN001, ANN201
        time.sleep(self.delay)
        self.sizes.append(len(items))
        return self._store.create_jobs(items)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._store, name)


def test_a_slow_write_never_blocks_the_loop_and_its_answers_come_after_the_commit(store: Store):
    slow = _SlowStore(store, 0.3)
    gc = GroupCommit(slow)  # type: ignore[arg-type]

    async def main() -> tuple[list[object], float]:
        sink = LoopSink(asyncio.get_running_loop())
        gaps: list[float] = []
        stop = False

        async def ticker() -> None:  # another caller on the same loop
            last = time.monotonic()
            while not stop:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        futs = [gc.create_soon(sink, make_job(f"j-loop-{i}", team="a", crid=f"c{i}"), [ev("submitted")])
                for i in range(20)]
        out = await asyncio.gather(*futs, return_exceptions=True)
        stop = True
        await tick
        return out, max(gaps)

    out, worst_gap = asyncio.run(main())
    assert all(isinstance(j, pb.Job) for j in out), out
    assert worst_gap < 0.2, f"the loop stalled {worst_gap:.3f} s while the store was slow"
    # every answered job is in the store: answers come only after the write
    assert {j.id for j in store.list_jobs(limit=0)} >= {j.id for j in out}  # type: ignore[union-attr]
    assert len(slow.sizes) < 20  # later submits rode in a group behind the slow first write


def test_loop_and_thread_callers_share_groups_and_a_duplicate_fails_alone(store: Store):
    slow = _SlowStore(store, 0.05)
    gc = GroupCommit(slow)  # type: ignore[arg-type]
    thread_results: list[object] = []

    def thread_caller(i: int) -> None:
        crid = "shared" if i == 0 else f"t{i}"
        try:
            thread_results.append(gc.create(make_job(f"j-thr-{i}", team="a", crid=crid), [ev("submitted")]))
        except StoreError as e:
            thread_results.append(e)

    async def main() -> list[object]:
        sink = LoopSink(asyncio.get_running_loop())
        threads = [threading.Thread(target=thread_caller, args=(i,)) for i in range(6)]
        for th in threads:
            th.start()
        futs = [gc.create_soon(sink, make_job(f"j-aio-{i}", team="a", crid="shared" if i == 0 else f"a{i}"),
                               [ev("submitted")]) for i in range(6)]
        out = await asyncio.gather(*futs, return_exceptions=True)
        for th in threads:
            await asyncio.to_thread(th.join, 30)
        return out

    loop_results = asyncio.run(main())
    every = loop_results + thread_results
    assert len(every) == 12
    # one request id sent by a loop caller and a thread caller: exactly one job
    jobs = [r for r in every if isinstance(r, pb.Job)]
    errors = [r for r in every if not isinstance(r, pb.Job)]
    assert len(jobs) == 11 and len(errors) == 1 and isinstance(errors[0], AlreadyExists)
    assert gc.members == 12 and gc.groups < 12
    assert len({j.id for j in store.list_jobs(limit=0)}) == 11


def test_a_failed_write_reaches_every_loop_member(store: Store):
    class Failing:
        def create_jobs(self, items):  # noqa: ANN001, ANN201
            raise Fenced("lost the lease")

    gc = GroupCommit(Failing())  # type: ignore[arg-type]

    async def main() -> list[object]:
        sink = LoopSink(asyncio.get_running_loop())
        futs = [gc.create_soon(sink, make_job(f"j-f-{i}", team="a"), [ev("submitted")]) for i in range(3)]
        return await asyncio.gather(*futs, return_exceptions=True)

    out = asyncio.run(main())
    assert all(isinstance(e, Fenced) for e in out), out
    # and the writer is idle again: a thread caller leads its own next write
    assert isinstance(GroupCommit(store).create(make_job("j-after", team="a"), [ev("submitted")]), pb.Job)
