"""A lost node replaced in place by a spare, the job restored from its peers' memory.

Real broker, one real agent (local executor, one rank per node) whose inventory has 4
nodes and reserves 1 spare (`spares: 1`), real gloo ranks of the library example
examples/byo/train_plain.py with the trainer option `memory_every=1` (one memory keeper
per node). The 3-node job is placed on the 3 ordinary nodes, never on the spare. One
node is then lost mid-run: its memory keeper and its rank are SIGKILLed (the fault
campaign's "kill one node's ranks"). Asserted:

* the agent blames the node; the recovery policy chooses REPLACE_IN_PLACE: attempt 2
  runs on the two survivors, in their slots, plus the spare in the lost node's slot;
* the relaunch restores from memory, losing at most one snapshot interval (1 step),
  newer than the durable checkpoint, and the events say "recovered from memory";
* the job finishes with every step's sample ids and loss equal to the same script run
  uninterrupted on 3 ranks;
* the spare is replenished from the pool (the lost node, free again, is the spare now)
  and `brokerctl capacity` / GetCapacity show it; `brokerctl job` shows the tier.

A second test: the same loss with the memory tier off takes today's path (from the
store), and the events say so and why.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from region_agents.executors import attempt_records as records
from region_agents.executors.attempt_records import AttemptRecord
from tests.fixtures.cluster import ROOT, Cluster, wait_until
from tests.fixtures.once import key_of, once_per_session
from tests.trainer.launch import launch, read_log
from tests.trainer.test_trainer_processes import assert_matches
from trainer.warm_start import READY_LINE

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "examples" / "byo" / "train_plain.py"
STEPS = 30
REGION = "us-east-2"
NODES = [f"{REGION}-n-{i:03d}" for i in range(4)]  # the last one is the spare at first
TRAIN_ARGS = ["--steps", str(STEPS), "--checkpoint-every", "10", "--seed", "6"]


def cli(cluster: Cluster, *args: str) -> str:
    env = dict(cluster.env(), COLUMNS="100", NO_COLOR="1")
    res = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address, *args],
                         capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, f"brokerctl {' '.join(args)}: {res.returncode}\n{res.stderr}"
    return res.stdout


def kill_node(root: Path, job_id: str, node: str, attempt: int, keeper: bool = True) -> int:
    """Lose ``node`` for the job: SIGKILL its memory keeper and warm rank starter, then
    its ranks (found by the keeper's port file path / the starter's module and CB_*
    environment / the agent's attempt record for ranks a starter forked (their /proc
    environment is the starter's) or the ranks' CB_* environment, under this test's root
    only). ``keeper``: the job has the memory tier (a keeper must be found). Returns how
    many processes were killed."""
    keeper_mark = f"memory-keepers/{job_id}/{node}.port".encode()
    env_marks = (f"CB_JOB_ID={job_id}".encode(), f"CB_NODE_ID={node}".encode(),
                 f"CB_ATTEMPT={attempt}".encode())
    keepers, starters, ranks = [], [], []
    for adir in root.glob(f"agents/*/jobs/{job_id}/attempt-{attempt}"):
        rec = AttemptRecord.load(records.record_path(adir))
        ranks += [r.pid for r in (rec.ranks if rec else []) if r.node_id == node
                  and records.same_process_alive(r.pid, r.start_ticks)]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes()
            environ = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(root).encode() in cmdline and keeper_mark in cmdline:
            keepers.append(int(d.name))
        elif b"trainer.warm_start" in cmdline and all(m in environ for m in env_marks[:2]) \
                and any(str(root).encode() in e for e in environ):
            starters.append(int(d.name))
        elif all(m in environ for m in env_marks) and any(str(root).encode() in e for e in environ):
            ranks.append(int(d.name))
    ranks = sorted(set(ranks))
    for pid in (*keepers, *starters, *ranks):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert ranks and bool(keepers) == keeper, (keepers, ranks)
    return len(keepers) + len(starters) + len(ranks)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The same script, uninterrupted, on 3 ranks started directly (no broker). Run once
    per session (tests/fixtures/once.py): tests/e2e/test_shrink_in_place.py compares
    with the same run."""
    def run_it() -> list[dict[str, Any]]:
        d = tmp_path_factory.mktemp("rip-reference")
        log = d / "loss.jsonl"
        run = launch(d / "run", 3, "{}", str(d / "ckpt"), job_id="j-ref",
                     argv=[str(SCRIPT), *TRAIN_ARGS, "--loss-log", str(log)])
        codes = run.wait(300)
        assert codes == [0, 0, 0], f"{codes}\n{run.output()}\n{run.stderr()}"
        records = read_log(log)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        return records

    return once_per_session(key_of("byo plain reference", 3, str(SCRIPT), TRAIN_ARGS), run_it)


def submit_plain_job(cluster: Cluster, client: Any, tmp_path: Path, spec: dict[str, Any],
                     train_args: list[str] = TRAIN_ARGS, extra_run: tuple[str, ...] = ()
                     ) -> tuple[Any, Path]:
    """Submit ``spec`` (team ``ml``) running the example script from a fresh project dir.

    The preamble the node-loss tests share: the script is copied into ``tmp_path/project``
    (the job's workdir), team ``ml`` gets 8 GPUs of quota, the first agent is waited for,
    and the job runs ``train_plain.py`` with ``train_args``, 0.3 s per step, then
    ``extra_run``, logging each step's samples and loss; the handle and that log."""
    code = tmp_path / "project"
    code.mkdir()
    shutil.copy(SCRIPT, code / "train_plain.py")
    log = tmp_path / "loss.jsonl"
    client.set_team_quota(team="ml", guaranteed_gpus=8)
    wait_until(lambda: any(r.connected for r in client.regions()), timeout=120,
               what=f"agent connected\n{cluster.logs()}")
    handle = client.submit({
        "team": "ml", **spec, "workdir": str(code),
        "run": ["python", "train_plain.py", *train_args, "--step-sleep", "0.3", *extra_run,
                "--loss-log", str(log)]})
    return handle, log


def run_and_lose_a_node(cluster: Cluster, tmp_path: Path, memory_every: int, nodes: int = 4
                        ) -> tuple[Any, pb.Job, Path, int, Any, list[str], set[str]]:
    """Submit the 3-node job on ``nodes`` nodes (the highest one the spare), lose its
    second node at step >= 14; the final job."""
    cluster.start_broker()
    cluster.start_agent(REGION, nodes=nodes, gpus=1, spares=1)
    spare = f"{REGION}-n-{nodes - 1:03d}"
    client_cm = cluster.client()
    client = client_cm.__enter__()
    handle, log = submit_plain_job(cluster, client, tmp_path, {
        "name": "rip", "nodes": 3, "gpus_per_node": 1,
        "trainer": {"total_steps": STEPS, "options": {"memory_every": str(memory_every)}}})
    first = wait_until(lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING and j,
                       timeout=240, what=f"attempt 1 running\n{cluster.logs()}")
    # the spare (highest id) is never used by an ordinary placement
    assert spare not in [a.node_id for a in first.placement.nodes], first.placement
    assert [a.node_id for a in first.placement.nodes] == NODES[:3], first.placement
    cap = client.capacity(region=REGION, include_nodes=True)
    assert sum(r.spare_gpus for r in cap.rows) == 1, cap
    assert [u.node.id for u in cap.nodes if u.spare] == [spare], cap.nodes
    wait_until(lambda: log.exists() and len(read_log(log)) >= 14, timeout=240,
               what=f"step 14\n{cluster.logs()}")
    # the attempt running now (on a loaded machine an agent may have self-fenced and
    # relaunched attempt 1 before: the loss is then of a later attempt, on the same nodes)
    lost_attempt = handle.status().attempt
    warm_at_kill = ready_starters(cluster.root, handle.id)
    kill_node(cluster.root, handle.id, NODES[1], attempt=lost_attempt, keeper=memory_every > 0)
    last = read_log(log)[-1]["step"]
    wait_until(lambda: (j := handle.status()).attempt == lost_attempt + 1
               and j.phase == pb.JOB_PHASE_RUNNING,
               timeout=240, what=f"the relaunch running\n{cluster.logs()}")
    # the spares while attempt 2 runs (after the job, every node is free again)
    spares_during = [u.node.id for u in client.capacity(region=REGION, include_nodes=True).nodes
                     if u.spare]
    job = handle.wait(timeout=400)
    assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
    return client_cm, job, log, last, client, spares_during, warm_at_kill


def starter_logs(root: Path, job_id: str) -> dict[str, str]:
    """Node -> its warm rank starter's log for the job (the agent's rank-starters dir)."""
    return {p.stem: p.read_text(errors="replace")
            for p in root.glob(f"agents/*/rank-starters/{job_id}/*.log")}


def ready_starters(root: Path, job_id: str) -> set[str]:
    return {n for n, text in starter_logs(root, job_id).items() if READY_LINE in text}


def warm_ranks_of(cluster: Cluster, job_id: str, attempt: int) -> int:
    """How many ranks of the attempt the agent started warm (its log says so)."""
    text = (cluster.root / "logs" / f"agent-{REGION}.log").read_text(errors="replace")
    m = re.search(rf"{job_id} attempt {attempt}: (\d+) of \d+ ranks started warm", text)
    return int(m.group(1)) if m else 0


def events_of(client: Any, job_id: str) -> list[pb.JobEvent]:
    return list(client.events(job_id))


def test_lost_node_replaced_in_place_by_a_spare_restores_from_memory(
        cluster: Cluster, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    client_cm, job, log, last, client, spares_during, warm_at_kill = run_and_lose_a_node(
        cluster, tmp_path, memory_every=1)
    try:
        events = events_of(client, job.id)
        decided = [e for e in events if e.type == "node_recovery"]
        assert len(decided) == 1, [(e.type, e.message) for e in events]
        assert decided[0].reason == "replace_in_place", decided[0]
        assert decided[0].details["replaced"] == f"{NODES[1]}={NODES[3]}", decided[0]
        # survivors in their slots, the spare in the lost node's slot, same world size
        assert job.attempt == job.node_recovery.failed_attempt + 1, job
        assert [a.node_id for a in job.placement.nodes] == [NODES[0], NODES[3], NODES[2]]
        rec = job.node_recovery
        assert (rec.plan, rec.tier, list(rec.lost_nodes)) == ("replace_in_place", "memory", [NODES[1]])
        recovered = [e for e in events if e.type == "recovered"]
        assert len(recovered) == 1, [(e.type, e.message) for e in events]
        ev = recovered[0]
        step, lost_steps = int(ev.details["step"]), int(ev.details["lost_steps"])
        assert ev.message.startswith(f"recovered from memory (step {step}, lost {lost_steps} steps)"), ev
        assert lost_steps <= 1, ev  # at most one snapshot interval (memory_every=1)
        assert last - 1 <= step <= last, (last, step)  # the kill's step, at most one back
        assert step > 10, step  # newer than the durable checkpoint (every 10 steps)
        assert "rank(s) 1 restored from another node's copy" in ev.message, ev
        assert job.progress.resume.tier == "memory" and list(job.progress.resume.restored_from_peer) == [1]

        # the spare is replenished from the pool: the lost node, free again, is the spare
        assert spares_during == [NODES[1]], spares_during
        shown = cli(cluster, "capacity")
        assert "SPARE" in shown, shown
        assert "recovered from memory" in cli(cluster, "job", job.id)
        # warm rank starters: on the job's nodes and on the spare its Launch named
        # (Launch.spare_nodes), started once attempt 1 ran; the relaunch forked its ranks
        # from every one that had finished its imports when the node was lost
        assert set(starter_logs(cluster.root, job.id)) >= {NODES[0], NODES[2], NODES[3]}
        relaunch_nodes = {NODES[0], NODES[2], NODES[3]}
        assert warm_ranks_of(cluster, job.id, job.attempt) >= len(warm_at_kill & relaunch_nodes)
    finally:
        client_cm.__exit__(None, None, None)

    records = read_log(log)
    by_step = {r["step"]: r for r in records}  # the redone step: the later attempt's record
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert {job.attempt - 1, job.attempt} <= {r["attempt"] for r in records}
    assert_matches(reference, [by_step[s] for s in sorted(by_step)], exact=False)


def test_lost_node_without_the_memory_tier_relaunches_from_the_store(
        cluster: Cluster, tmp_path: Path, reference: list[dict[str, Any]]) -> None:
    # 5 nodes: the relaunch from the store needs 3 ordinary nodes besides the spare
    client_cm, job, log, last, client, spares_during, warm_at_kill = run_and_lose_a_node(
        cluster, tmp_path, memory_every=0, nodes=5)
    try:
        events = events_of(client, job.id)
        decided = [e for e in events if e.type == "node_recovery"]
        assert [e.reason for e in decided] == ["from_store"], [(e.type, e.message) for e in events]
        assert "memory tier is off" in decided[0].message, decided[0]
        placed = [a.node_id for a in job.placement.nodes]
        assert NODES[1] not in placed, placed  # blamed: avoided
        assert f"{REGION}-n-004" not in placed, placed  # the spare stays a spare
        assert spares_during == [f"{REGION}-n-004"], spares_during
        recovered = [e for e in events if e.type == "recovered"]
        assert len(recovered) == 1, [(e.type, e.message) for e in events]
        ev = recovered[0]
        assert ev.message.startswith("recovered from store (step 10, lost "), ev
        assert ev.message.endswith("the job's memory tier is off (trainer option memory_every)"), ev
        assert int(ev.details["lost_steps"]) >= 3, ev  # the durable interval, not one step
        assert job.node_recovery.tier == "store"
        assert starter_logs(cluster.root, job.id) == {}  # no memory tier: nothing warm
        assert not warm_at_kill
    finally:
        client_cm.__exit__(None, None, None)
    records = read_log(log)
    by_step = {r["step"]: r for r in records}
    assert sorted(by_step) == list(range(1, STEPS + 1))
    assert_matches(reference, [by_step[s] for s in sorted(by_step)], exact=False)
