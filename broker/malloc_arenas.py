"""Cap glibc's malloc arenas in the broker process (``brokerctl serve``), and hand
freed memory back to the kernel now and then (:class:`FreedMemoryReturner`).

Why: glibc gives each thread that allocates concurrently its own arena, up to 8 per
core, and memory freed into one arena is not reused by the others. The broker runs
dozens of threads (the gRPC pool, the group-commit leaders, the scheduler), so the
memory a burst of submits or a scheduler pass over a large backlog touched stays
spread over many arenas: an empty broker measured 310-380 MB of RSS after a few
seconds of submits (benchmarks/bench_submit_cpu.py), most of it freed memory kept in
idle arenas. Python's own small objects come from pymalloc under the GIL anyway, so
few arenas cost no contention that matters here.

Set before the server starts its threads (arenas are created on first use). An
operator's ``MALLOC_ARENA_MAX`` in the environment wins: glibc reads it at start,
and this leaves it alone. Not glibc (musl, macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

M_ARENA_MAX = -8  # mallopt(3) parameter number, glibc's malloc.h
DEFAULT_ARENAS = 2


def cap_malloc_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Limit glibc malloc to ``arenas`` arenas; True when applied."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))


TRIM_INTERVAL_S = 10.0


class FreedMemoryReturner:
    """A daemon thread that hands freed heap memory back to the kernel every
    ``interval_s`` (glibc ``malloc_trim(0)``).

    Why: glibc returns a freed block to the kernel only when it sits at the top of its
    heap; memory freed in the middle of a heap (or of an arena) stays in the process's
    RSS until something at the top is freed too. The broker frees a lot in bursts:
    16 TLS connections' buffers when clients go (an empty broker measured ~190 MB
    right after a burst of submits and ~90 MB a few seconds later, or minutes later),
    a full re-read of a large backlog, a usage view. ``malloc_trim(0)`` releases the
    free pages of every arena; it holds each arena's lock while it walks it (a few ms
    at hundreds of MB), so it runs rarely. Not glibc: nothing to do (``start`` is
    False)."""

    def __init__(self, interval_s: float = TRIM_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._stop = threading.Event()
        self._trim: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
        name = ctypes.util.find_library("c")
        if name:
            try:
                fn = ctypes.CDLL(name).malloc_trim
            except (OSError, AttributeError):
                fn = None
            if fn is not None:
                fn.argtypes = [ctypes.c_size_t]
                fn.restype = ctypes.c_int
                self._trim = fn

    def trim(self) -> None:
        """Return the free pages now."""
        if self._trim is not None:
            self._trim(0)
            self.trims += 1

    def start(self) -> bool:
        if self._trim is None:
            return False
        threading.Thread(target=self._run, name="malloc-trim", daemon=True).start()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim()

    def stop(self) -> None:
        self._stop.set()
