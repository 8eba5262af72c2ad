"""`brokerctl serve --ready-file PATH`: the file appears only when a call succeeds, a
stale one never says "ready", it goes when the broker stops, and `wait-ready
--ready-file` waits for the same file. A real `brokerctl serve` process with TLS and
a bootstrap token, probed with the SDK (no retries: one call each)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from brokersdk.client import BrokerClient, BrokerError
from tests.cli.conftest import run_cli
from tests.fixtures.cluster import Proc, brokerctl, free_port
from tests.fixtures.pki import session_pki


def _serve(tmp_path: Path, port: int, ready: Path) -> Proc:
    args = ["serve", "--listen", f"127.0.0.1:{port}", "--store",
            f"sqlite:///{tmp_path / 'broker.sqlite'}", "--checkpoint-root", str(tmp_path / "ck"),
            "--agent-listen", "127.0.0.1:0", "--ready-file", str(ready)]
    for key, value in session_pki().broker_settings().items():
        args += ["--set", f"{key}={value}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = Proc("broker", brokerctl(*args), tmp_path / "broker.log")
    p.start(env)
    return p


def _answers(address: str) -> bool:
    client = BrokerClient(address, timeout=2.0, retries=0, credentials=session_pki().operator())
    try:
        client.whoami()
        return True
    except BrokerError:
        return False
    finally:
        client.close()


def test_the_ready_file_appears_only_once_a_call_succeeds(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    port = free_port()
    address = f"127.0.0.1:{port}"
    ready = tmp_path / "run" / "broker.ready"
    ready.parent.mkdir()
    ready.write_text('{"pid": 1, "address": "stale"}\n')  # an earlier run's, left behind
    proc = _serve(tmp_path, port, ready)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.alive(), proc.tail()
            assert time.monotonic() < deadline, f"no ready file after 60 s\n{proc.tail()}"
            text = ready.read_text() if ready.exists() else ""
            if text and json.loads(text)["pid"] == proc.popen.pid:
                break
            assert not text or json.loads(text)["pid"] == 1
            time.sleep(0.02)
        # The file exists: the very first call, without a retry, is answered.
        assert _answers(address), proc.tail()
        info = json.loads(ready.read_text())
        assert info["address"] == address and info["port"] == port and info["tls"] is True
        assert info["role"] == "leader" and info["agent_port"] > 0
        # wait-ready agrees, with and without the file.
        rc, out, err = run_cli(capsys, "--broker", address, "wait-ready", "--ready-file",
                               str(ready), "--wait-timeout", "10")
        assert rc == 0 and f"broker ready at {address}" in out, err
        proc.kill(signal.SIGTERM)
        assert proc.popen.returncode == 0, proc.tail()
        assert not ready.exists(), "the ready file outlived the broker"
    finally:
        proc.kill()


def test_a_broker_that_cannot_start_leaves_no_ready_file(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    ready = tmp_path / "broker.ready"
    ready.write_text('{"pid": 1}\n')
    proc = _serve(tmp_path, port, ready)
    try:
        assert proc.popen.wait(timeout=60) == 1, proc.tail()
        assert "broker did not start" in proc.tail()
        assert not ready.exists()
    finally:
        proc.kill()
        taken.close()
    rc, out, _ = run_cli(capsys, "--broker", f"127.0.0.1:{port}", "wait-ready", "--ready-file",
                         str(ready), "--wait-timeout", "0.5")
    assert rc == 1 and "broker.ready was not written" in " ".join(out.split()), out
