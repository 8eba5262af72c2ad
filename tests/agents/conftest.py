"""Fixtures for agent tests: a contract-honoring fake trainer script and inventories."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from region_agents.agent import AgentConfig, RegionAgent
from tests.agents.fake_broker import FakeBroker

# A tiny stand-in for `python -m trainer` that honours docs/contracts.md: rank 0 writes
# the progress file atomically each step, SIGTERM -> "checkpoint" + exit 75, SIGUSR1 ->
# checkpoint and continue, exit 0 at the end. As the trainer library does, it unblocks
# SIGUSR1 right after installing its handlers (ranks start with it blocked:
# checkpoint_layout/held_signals.py), and no rank takes a step before every rank has
# its handlers in (the real trainer's first step is a collective of all ranks; here each
# rank leaves a ready file in CB_WORK_DIR and rank 0 waits for all of them): "running"
# means what it means with the real trainer, so a test's stop or checkpoint-now that
# follows RUNNING reaches handlers, however slowly the machine starts the other ranks.
# Knobs (env): FAKE_STEPS, FAKE_STEP_S,
# FAKE_FAIL_RANK + FAKE_FAIL_AT (exit 3 with a message on stderr), FAKE_IGNORE_TERM
# (ignore SIGTERM: forces a SIGKILL after grace), FAKE_HANG_AT (stop writing progress),
# FAKE_RANK0_END_DELAY (rank 0 ends last), FAKE_WRITE_EXIT (write CB_EXIT_FILE at exit).
FAKE_TRAINER = textwrap.dedent(
    r'''
    import json, os, signal, sys, time

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    steps = int(os.environ.get("FAKE_STEPS", "20"))
    step_s = float(os.environ.get("FAKE_STEP_S", "0.1"))
    fail_rank = int(os.environ.get("FAKE_FAIL_RANK", "-1"))
    fail_at = int(os.environ.get("FAKE_FAIL_AT", "3"))
    hang_at = int(os.environ.get("FAKE_HANG_AT", "-1"))
    path = os.environ["CB_PROGRESS_FILE"]
    ckpt = os.environ["CB_CHECKPOINT_URI"]
    state = {"step": 0, "ckpt": 0, "term": False, "usr1": False}

    def write(s):
        if rank != 0:
            return
        now = time.time()
        data = {"job_id": os.environ["CB_JOB_ID"], "attempt": int(os.environ["CB_ATTEMPT"]),
                "state": s, "step": state["step"], "total_steps": steps,
                "samples_seen": state["step"] * 8, "loss": 1.0 / (1 + state["step"]),
                "tokens_per_s": 100.0, "last_checkpoint_step": state["ckpt"],
                "last_checkpoint_uri": f"{ckpt}/step-{state['ckpt']:09d}" if state["ckpt"] else "",
                "world_size": world, "time": now, "heartbeat": now}
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def on_term(*_):
        state["term"] = True

    def on_usr1(*_):
        state["usr1"] = True

    signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("FAKE_IGNORE_TERM") else on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    from checkpoint_layout.held_signals import release
    release()  # a checkpoint-now that came while this rank started is delivered here
    print(f"rank {rank}/{world} env ok: job={os.environ['CB_JOB_ID']} port={os.environ['MASTER_PORT']}", flush=True)
    write("starting")
    ready = os.path.join(os.environ["CB_WORK_DIR"], ".fake-ready-{}")
    open(ready.format(rank), "w").close()
    if rank == 0:  # the first step's "collective": every rank has its handlers in
        deadline = time.monotonic() + 120
        while not all(os.path.exists(ready.format(r)) for r in range(world)):
            if time.monotonic() > deadline:
                print("fake trainer: a peer never got ready", file=sys.stderr, flush=True)
                sys.exit(4)
            time.sleep(0.02)
    while state["step"] < steps:
        if state["term"]:
            state["ckpt"] = state["step"]
            write("checkpointing")
            sys.exit(75)
        if rank == fail_rank and state["step"] == fail_at:
            print("boom: simulated crash on purpose", file=sys.stderr, flush=True)
            sys.exit(int(os.environ.get("FAKE_FAIL_CODE", "3")))
        if state["step"] == hang_at:
            while True:
                time.sleep(1)
        time.sleep(step_s)
        state["step"] += 1
        if state["usr1"]:
            state["usr1"] = False
            state["ckpt"] = state["step"]
        write("running")
    state["ckpt"] = steps
    if rank == 0 and os.environ.get("FAKE_RANK0_END_DELAY"):  # a final save rank 0 ends last
        write("checkpointing")
        time.sleep(float(os.environ["FAKE_RANK0_END_DELAY"]))
    write("done")
    if os.environ.get("FAKE_WRITE_EXIT") and os.environ.get("CB_EXIT_FILE"):
        with open(os.environ["CB_EXIT_FILE"], "w") as f:  # as trainer.errors.record_exit
            f.write("0\n")
    sys.exit(0)
    '''
)

INVENTORY = textwrap.dedent(
    """
    region: test-1
    agent_id: test-1-a
    checkpoint_bucket: {bucket}
    node_groups:
      - name_prefix: t1-p5
        count: 2
        instance_type: p5.48xlarge
        accelerator: h100
        gpus: 8
        efa: 32
        capacity_type: on_demand
        price_per_gpu_hour: 4.1
        labels:
          topology.kubernetes.io/zone: t1-az1
          topology.k8s.aws/network-node-layer-1: l1-a
          topology.k8s.aws/network-node-layer-2: l2-a
          topology.k8s.aws/network-node-layer-3: l3-a
      - name_prefix: t1-spot
        count: 1
        gpus: 4
        capacity_type: spot
        price_per_gpu_hour: 1.5
        labels:
          topology.kubernetes.io/zone: t1-az2
    """
)


@pytest.fixture
def fake_trainer(tmp_path: Path) -> list[str]:
    """The command (spec.command) that runs the contract-honouring fake trainer."""
    script = tmp_path / "fake_trainer.py"
    script.write_text(FAKE_TRAINER)
    return [sys.executable, str(script)]


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY.format(bucket=tmp_path / "ckpt"))
    return path


@pytest.fixture
def broker():
    """A scripted FakeBroker on a real gRPC server (fake_broker.py)."""
    b = FakeBroker(heartbeat_interval_s=0.3)
    b.start()
    yield b
    b.stop()


@pytest.fixture
def agent(broker, inventory_file, tmp_path):
    """A real RegionAgent (local executor) connected to `broker`."""
    a = RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=broker.address, inventory_path=str(inventory_file),
                                work_dir=str(tmp_path / "work"), ranks_per_node=1,
                                hang_timeout_s=120))
    a.start()
    yield a
    a.stop()
