"""A taken rendezvous port is a clean, retryable exit that blames no node (exit 80), and
the local executor picks MASTER_PORT where outgoing connections never take it.

Found by the fault campaign (seed 6): rank 0 died with a raw torch traceback
(EADDRINUSE) because the port the agent picked with a port-0 bind had been taken by
another process's outgoing connection before rank 0 listened."""

from __future__ import annotations

import socket
from pathlib import Path

from region_agents.executors.base import NOT_THE_NODE
from region_agents.executors.local import _ephemeral_low, free_port
from tests.trainer.launch import launch, tiny_spec
from trainer.errors import EXIT_RENDEZVOUS_PORT_TAKEN


def test_trainer_exits_80_with_one_line_when_the_port_is_taken(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = launch(tmp_path / "run", 1, tiny_spec(total_steps=4), str(tmp_path / "ckpt"),
                     master_port=port)
        codes = run.wait(240)
    out = run.output() + (tmp_path / "run" / "rank0.err").read_text()
    assert codes == [EXIT_RENDEZVOUS_PORT_TAKEN], out
    assert f"the rendezvous port {port} is already taken" in out
    assert "Traceback" not in out
    assert EXIT_RENDEZVOUS_PORT_TAKEN in NOT_THE_NODE  # the agent blames no node for it


def test_executor_ports_avoid_the_ephemeral_range_and_repeats() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)  # none handed out twice while attempts start
    if low - 20000 >= 1000:
        assert all(20000 <= p < low for p in ports)
    for p in ports:  # and each was free when handed out (still free: nobody took it)
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
