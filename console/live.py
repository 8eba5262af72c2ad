"""Live pages: server-sent events that carry the page's freshly rendered content.

Why push HTML, not data: the server already renders every page; sending the new
``<main>`` when it changed keeps one renderer (no second one in JavaScript) and makes
the browser side a dozen lines (static/console.js). A job page re-renders as soon as
the broker's WatchJob stream reports an event (and every few seconds while it runs, for
the growing bars); pages over the whole fleet have no watch stream in the API, so they
re-render on an interval and send only when the content changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool

from brokersdk.client import BrokerClient, BrokerError

KEEPALIVE_S = 15.0
MIN_GAP_S = 1.0  # renders at most this often: a burst of events is one refresh


def sse(event: str, data: str) -> str:
    """One server-sent event (every line of ``data`` its own ``data:`` field)."""
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {event}\n{lines}\n"


def watch_job(client: BrokerClient, job_id: str, notify: Callable[[], None],
              stop: threading.Event) -> None:
    """Follow the job's WatchJob stream and call ``notify`` on each new event, until the
    job is terminal or ``stop`` is set. Each watch is bounded (timeout) so a closed page
    releases its thread within that time even though a gRPC read cannot be interrupted."""
    try:
        after = max((e.seq for e in client.events(job_id)), default=0)
    except BrokerError:
        return
    while not stop.is_set():
        try:
            for event in client.watch(job_id, after_seq=after, include_progress=True,
                                      timeout=20):
                after = max(after, event.seq)
                notify()
                if stop.is_set():
                    return
            notify()
            return  # the job is terminal: its page will not change again
        except TimeoutError:
            continue
        except BrokerError:
            stop.wait(2.0)


async def stream_page(render: Callable[[], str], is_disconnected: Callable[[], object],
                      interval_s: float, watch: Callable[[Callable[[], None],
                                                          threading.Event], None] | None = None,
                      ) -> AsyncIterator[str]:
    """Send ``render()``'s HTML as an "html" event whenever it differs from the last one;
    re-render every ``interval_s`` and whenever ``watch`` (run in a thread) notifies."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    stop = threading.Event()
    if watch is not None:
        def notify() -> None:
            loop.call_soon_threadsafe(wake.set)

        threading.Thread(target=watch, args=(notify, stop), daemon=True,
                         name="console-watch").start()
    last = ""
    quiet = 0.0
    try:
        yield "retry: 3000\n\n"
        while True:
            if await is_disconnected():  # type: ignore[misc]
                return
            wake.clear()
            try:
                html = await run_in_threadpool(render)
            except BrokerError as e:
                html = ""
                yield sse("problem", e.message)
            digest = hashlib.sha256(html.encode()).hexdigest()
            if html and digest != last:
                last = digest
                quiet = 0.0
                yield sse("html", html)
            elif quiet >= KEEPALIVE_S:
                quiet = 0.0
                yield ": keepalive\n\n"
            await asyncio.sleep(MIN_GAP_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), max(0.0, interval_s - MIN_GAP_S))
            quiet += interval_s
    finally:
        stop.set()
