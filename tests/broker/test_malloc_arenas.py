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
