"""Pause Python's cyclic garbage collector for the length of one placement pass.

Why: a pass allocates a few objects per pending job and per node (tuples, reasons,
the from-scratch capacity index), and every so many allocations CPython runs a
collection. The oldest generation's collection walks *every* live object of the
process: the snapshot itself (a node and a request per queued job), and in the
broker every job record too. At 100k GPUs / 25k pending such collections were
about 40% of a pass, and their cost grows with the process while their number
grows with the pass: quadratic growth from a linear algorithm. Paused, the objects
a pass allocated are looked at once, by the first young collection after it.

Nothing in a pass depends on when garbage is freed, so decisions are unchanged.
Re-entrant and thread-safe enough for the broker: only the outermost pause that
found the collector enabled turns it back on.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Run the body with the cyclic collector off (reference counting still frees
    everything that is not in a cycle)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
