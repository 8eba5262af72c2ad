"""`brokerctl agent` = region_agents.agent.main(argv), run as a real process against the
scripted FakeBroker: it registers, heartbeats, and exits 0 on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.agents.fake_broker import FakeBroker, wait_for

REPO = Path(__file__).resolve().parents[2]


def test_main_registers_and_stops_on_sigterm(inventory_file, tmp_path):
    broker = FakeBroker(heartbeat_interval_s=0.2)
    broker.start()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from region_agents.agent import main; sys.exit(main(sys.argv[1:]))",
         "--broker", broker.address, "--inventory", str(inventory_file), "--agent-id", "cli-agent",
         "--work-dir", str(tmp_path / "w"), "--ranks-per-node", "1", "--env", "A=1",
         *(["--allow-root-jobs"] if os.geteuid() == 0 else [])],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        reg = wait_for(lambda: broker.of("register"), 60, what="register from the CLI agent")[0]
        assert reg.agent_id == "cli-agent" and len(reg.nodes) == 3
        wait_for(lambda: len(broker.of("heartbeat")) >= 2, 60, what="heartbeats")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        broker.stop()
    assert b"registered as cli-agent" in proc.stdout.read()


def test_a_broken_stream_is_logged_on_one_line() -> None:
    """Found starting the README's `brokerctl agent` next to a starting broker: every
    reconnect logged the gRPC error's five-line repr."""
    import grpc

    from region_agents.agent import rpc_error_text

    class Broken(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return "failed to connect to all addresses"

    assert rpc_error_text(Broken()) == "UNAVAILABLE: failed to connect to all addresses"
    assert rpc_error_text(grpc.RpcError("plain")) == "plain"


def test_agent_with_no_broker_logs_one_line_per_outage(inventory_file, tmp_path):
    """A real agent process dialling a port where nothing listens: one warning line for
    the outage (its retries stay quiet), never a `_MultiThreadedRendezvous` repr."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    log = tmp_path / "agent.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from region_agents.agent import main; sys.exit(main(sys.argv[1:]))",
             "--broker", dead, "--inventory", str(inventory_file), "--agent-id", "lonely",
             "--work-dir", str(tmp_path / "w"), "--ranks-per-node", "1",
             *(["--allow-root-jobs"] if os.geteuid() == 0 else [])],
            cwd=REPO, stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "unreachable" in log.read_text(), 60, what="the outage warning")
        time.sleep(3.0)  # more retries happen here (backoff from 0.2 s); not asserted on time
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Rendezvous" not in text and "Traceback" not in text, text
    warnings = [line for line in text.splitlines() if "unreachable" in line]
    assert len(warnings) == 1, text
    assert f"broker {dead} unreachable: UNAVAILABLE" in warnings[0], warnings
