"""A real headless Chromium (Debian's ``chromium``) driven by Playwright, for console tests.

Never downloads a browser (no ``playwright install``): it launches /usr/bin/chromium with
a fresh profile directory and every background network feature off, so a test run talks
only to the loopback servers it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.cluster import ROOT, free_port, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def require_browser() -> Any:
    """The Playwright module, or a skip that says what to install."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: apt-get install chromium (scripts/bootstrap.sh test)")
    try:
        from playwright import sync_api
    except ImportError:
        pytest.skip("python package playwright is missing: pip install -e '.[test]'")
    return sync_api


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched browser (Playwright sync API). Playwright gives each launch a fresh
    temporary profile; each ``new_context()`` is a separate cookie jar (one per user)."""
    sync_api = require_browser()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                    headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_user(browser: Any) -> Any:
    """A browser context of its own (cookies, storage) at a laptop's screen size."""
    return browser.new_context(viewport={"width": 1366, "height": 768})


class ConsoleProcess:
    """`brokerctl console` as a subprocess on a free loopback port."""

    def __init__(self, broker: str, log: Path, env: dict[str, str], *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        fh = open(log, "ab")  # noqa: SIM115 - handed to the child
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "brokerctl", "--broker", broker, "console", "--listen",
             f"127.0.0.1:{self.port}", *extra], stdout=fh, stderr=subprocess.STDOUT, env=env,
            cwd=str(ROOT), start_new_session=True)
        fh.close()
        wait_until(lambda: self.alive() and "console for broker" in log.read_text(), timeout=60,
                   what=f"the console to listen\n{self.tail()}")

    def alive(self) -> bool:
        assert self.popen.poll() is None, self.tail()
        return True

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)


def console_env(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "proto"),
                                         env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


__all__ = ["CHROMIUM", "ConsoleProcess", "chromium", "console_env", "new_user",
           "require_browser"]
