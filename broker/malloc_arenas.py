"""Cap glibc's malloc arenas in the broker process (``brokerctl serve``).

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
