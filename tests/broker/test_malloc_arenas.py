"""The broker caps glibc's malloc arenas at start (broker/malloc_arenas.py), unless
the operator set MALLOC_ARENA_MAX; run in child processes, as the setting is per process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from broker.malloc_arenas import cap_malloc_arenas; print(cap_malloc_arenas())"


def run(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt(M_ARENA_MAX) is glibc's")
def test_applied_on_glibc() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert run(env) == "True"


def test_the_operators_setting_wins() -> None:
    assert run(dict(os.environ, MALLOC_ARENA_MAX="4")) == "False"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_memory_goes_back_to_the_kernel() -> None:
    """Memory freed in the middle of the heap (every other 64 KB block of ~100 MB, so
    the free blocks are not at the top) leaves the RSS only through a trim."""
    code = """
import gc
from broker.malloc_arenas import FreedMemoryReturner
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS"))
blocks = [bytearray(64 * 1024) for _ in range(1600)]
keep = blocks[1::2]
del blocks
gc.collect()
before = rss()
t = FreedMemoryReturner(interval_s=0.05)
assert t.start()
import time
deadline = time.time() + 10
while t.trims == 0 and time.time() < deadline:
    time.sleep(0.05)
t.stop()
print(t.trims > 0, before - rss(), len(keep))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) > 20_000  # KiB returned: most of the ~50 MB freed
