"""End to end: a user's own training script, submitted through the CLI, moved twice.

The proof of issue 11 ("your own training code gets everything"): the library example
examples/byo/train_plain.py, copied into a project directory, is submitted the way a user
would (`brokerctl submit --workdir DIR ... -- python train_plain.py ...`), on spot capacity,
elastic between 1 and 2 nodes. A spot notice moves it from region A (2 nodes) to region B
(1 node, 2 -> 1); a second spot notice moves it on to region C (2 nodes, 1 -> 2). Real
broker, three real agents (local executor, one rank per node), real gloo ranks and moto's
S3 HTTP server with one checkpoint bucket per region. Asserted, against the same script
run uninterrupted on 2 ranks:

* every step trains on the same sample ids with the same loss (REL_TOL, as the built-in
  trainer's migration tests) and the final model state is the same;
* each resumed attempt starts at the step after the checkpoint it resumed from, and the
  final sequence neither repeats nor skips a sample;
* `brokerctl logs` (live with `-f`, and afterwards with and without `-f`) shows the
  script's own per-step lines of all three attempts, in order, each after a separator
  naming its region and world size.

The command is a bare `python`: the agent runs it as its own interpreter (the one with
torch and the library; docs/contracts.md section 10), not the host's first `python` on PATH.

The per-step JSONL log (the example's `--loss-log`) is one absolute path shared by every
attempt: all "regions" are on this machine; on real machines it would be collected from
each attempt's node, and the `brokerctl logs` assertions show the same lines arrive that way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_logs import sections
from tests.e2e.test_migration import REL_TOL, assert_equivalent, manifests, s3_setup
from tests.fixtures.cluster import ROOT, Cluster, wait_until
from tests.trainer.launch import launch, read_log

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "examples" / "byo" / "train_plain.py"
STEPS = 60
# Same training arguments for the reference and the broker run (the sleep only slows the
# broker run down enough to move it twice; it does not change what is computed).
TRAIN_ARGS = ["--steps", str(STEPS), "--checkpoint-every", "5", "--global-batch", "32",
              "--micro-batch", "8", "--seed", "3", "--log-every", "1"]
SLEEP = "0.3"
A, B, C = "us-east-2", "eu-west-1", "ap-south-1"
STEP_LINE = re.compile(r"^(?:\(rank 0\) )?trainer: step (\d+) loss (\d+\.\d{4})$")


def cli(cluster: Cluster, *args: str, timeout: float = 120) -> str:
    """`brokerctl --broker ADDR ARGS...` as a user runs it; its stdout (must exit 0)."""
    env = dict(cluster.env(), COLUMNS="100", NO_COLOR="1")
    res = subprocess.run([sys.executable, "-m", "brokerctl", "--broker", cluster.address, *args],
                         capture_output=True, text=True, env=env, timeout=timeout)
    assert res.returncode == 0, f"brokerctl {' '.join(args)}: {res.returncode}\n{res.stderr}"
    return res.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same script, uninterrupted, on 2 ranks started directly (no broker)."""
    d = tmp_path_factory.mktemp("byo-reference")
    log, final = d / "loss.jsonl", d / "final.pt"
    run = launch(d / "run", 2, "{}", str(d / "ckpt"), job_id="j-ref",
                 argv=[str(SCRIPT), *TRAIN_ARGS, "--loss-log", str(log), "--export", str(final)])
    codes = run.wait(300)
    assert codes == [0, 0], f"{codes}\n{run.output()}\n{run.stderr()}"
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert records[-1]["loss"] < records[0]["loss"], "the example does not learn"
    return {"log": records, "final": final}


def step_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(step, loss as printed) of the script's own `step N loss X` lines."""
    return [(int(m.group(1)), m.group(2)) for x in lines if (m := STEP_LINE.match(x))]


def notice(cluster: Cluster, region: str, job: pb.Job) -> None:
    """A spot interruption warning for every node of the job (the agent's notice files)."""
    notices = cluster.root / "agents" / region / "spot-notices"
    notices.mkdir(parents=True, exist_ok=True)
    for a in job.placement.nodes:
        (notices / a.node_id).write_text("60")


def attempt_in(handle: Any, attempt: int, region: str, *phases: int) -> Any:
    def ok() -> Any:
        j = handle.status()
        return (j.phase in phases and j.attempt == attempt and j.placement.region == region) and j
    return ok


def test_library_script_moves_2_to_1_to_2_and_matches_an_uninterrupted_run(
        cluster: Cluster, s3_server: Any, tmp_path: Path, reference: dict[str, Any]) -> None:
    buckets = s3_setup(cluster, s3_server, A, B, C)
    cluster.start_broker()
    cluster.start_agent(A, nodes=2, gpus=1, capacity_type="spot", price=1.0,
                        checkpoint_bucket=f"s3://{buckets[A]}")
    cluster.start_agent(B, nodes=1, gpus=1, capacity_type="spot", price=2.0,
                        checkpoint_bucket=f"s3://{buckets[B]}")
    cluster.start_agent(C, nodes=2, gpus=1, price=5.0, checkpoint_bucket=f"s3://{buckets[C]}")
    code = tmp_path / "my-project"  # the user's project: their script, nothing else
    code.mkdir()
    shutil.copy(SCRIPT, code / "train_plain.py")
    log, final = tmp_path / "loss.jsonl", tmp_path / "final.pt"
    with cluster.client() as client:
        client.set_team_quota(team="ml", guaranteed_gpus=16)
        wait_until(lambda: sum(r.connected for r in client.regions()) == 3, timeout=120,
                   what=f"three regions\n{cluster.logs()}")
        # C is held back (cordoned) so the first move can only go to B's single node.
        for i in range(2):
            cli(cluster, "cordon", f"{C}-n-{i:03d}")
        submitted = json.loads(cli(
            cluster, "submit", "-o", "json", "--name", "byo", "--team", "ml", "--nodes", "2",
            "--gpus-per-node", "1", "--spot", "--min-nodes", "1", "--max-nodes", "2",
            "--workdir", str(code), "--",
            "python", "train_plain.py", *TRAIN_ARGS, "--step-sleep", SLEEP,
            "--loss-log", str(log), "--export", str(final)))
        handle = client.job(submitted["id"])
        follower = subprocess.Popen(
            [sys.executable, "-m", "brokerctl", "--broker", cluster.address, "logs", handle.id,
             "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(cluster.env(), COLUMNS="100", NO_COLOR="1"))
        try:
            first = wait_until(
                lambda: (j := handle.status()).phase == pb.JOB_PHASE_RUNNING
                and j.progress.last_checkpoint_step >= 5 and j, timeout=240,
                what=f"attempt 1 running with a checkpoint\n{cluster.logs()}")
            assert (first.attempt, first.placement.region, first.placement.world_size) == (1, A, 2)
            notice(cluster, A, first)  # 2 -> 1
            second = wait_until(
                attempt_in(handle, 2, B, pb.JOB_PHASE_LAUNCHING, pb.JOB_PHASE_RUNNING),
                timeout=240, what=f"attempt 2 placed in {B}\n{cluster.logs()}")
            assert second.placement.world_size == 1
            for i in range(2):  # placed: C may take the next move
                cli(cluster, "cordon", "--undo", f"{C}-n-{i:03d}")
            # Running as far as the broker knows (else the notice stops it without a
            # checkpoint) and past its first step (it resumed).
            wait_until(attempt_in(handle, 2, B, pb.JOB_PHASE_RUNNING), timeout=240,
                       what=f"attempt 2 running in {B}\n{cluster.logs()}")
            wait_until(lambda: any(r["attempt"] == 2 for r in read_log(log)), timeout=120,
                       what=f"attempt 2 training\n{cluster.logs()}")
            notice(cluster, B, second)  # 1 -> 2
            job = handle.wait(timeout=300)
            assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
            assert (job.attempt, job.placement.region, job.placement.world_size) == (3, C, 2)
            assert job.progress.step == STEPS
            followed, err = follower.communicate(timeout=120)
            assert follower.returncode == 0, err
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()

        migs = sorted(client.migrations(job_id=job.id), key=lambda m: m.from_attempt)
        hops = [(m.cause, m.state, m.from_region, m.to_region, m.from_world_size,
                 m.to_world_size) for m in migs]
        assert hops == [("spot_interruption", "done", A, B, 2, 1),
                        ("spot_interruption", "done", B, C, 1, 2)], hops
        # The ranks that really ran, as the agents reported them (not the GPUs placed).
        assert [(m.from_ranks, m.to_ranks) for m in migs] == [(2, 1), (1, 2)], migs
        assert job.placement.ranks == 2, job.placement
        for m, (src, dst) in zip(migs, ((A, B), (B, C)), strict=True):
            # Saved in the old region's bucket, copied into the new one's, resumed there.
            assert m.checkpoint_uri.startswith(f"s3://{buckets[src]}/jobs/{job.id}/"), m
            assert m.resume_from.startswith(f"s3://{buckets[dst]}/jobs/{job.id}/"), m
            assert m.transfer.done and not m.transfer.error and m.transfer.bytes_total > 0
        done = manifests(s3_server, buckets[C], f"jobs/{job.id}/attempt-3/")
        assert any(mf["step"] == STEPS and mf["attempt"] == 3 for mf in done.values()), done

    # 1. Same samples, same losses, same final model as the uninterrupted run.
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "a step repeated or lost"
    assert [r["attempt"] for r in records] == sorted(r["attempt"] for r in records)
    by_attempt = {a: [r for r in records if r["attempt"] == a] for a in (1, 2, 3)}
    assert all(by_attempt.values()), {a: len(rs) for a, rs in by_attempt.items()}
    assert [{r["world_size"] for r in by_attempt[a]} for a in (1, 2, 3)] == [{2}, {1}, {2}]
    assert_equivalent(records, reference["log"])
    got, want = torch.load(final), torch.load(reference["final"])
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=REL_TOL, atol=1e-6), k

    # 3. Each resumed attempt starts at the next unseen sample: the step after the
    # checkpoint it resumed from, and no sample id twice or missing across the run.
    for m, attempt in zip(migs, (2, 3), strict=True):
        assert by_attempt[attempt][0]["step"] == m.checkpoint_step + 1, (m, by_attempt[attempt][0])
        assert by_attempt[attempt - 1][-1]["step"] == m.checkpoint_step  # emergency save
    ids = [i for r in records for i in r["ids"]]
    assert len(ids) == len(set(ids)) == STEPS * 32  # one epoch is 4096 samples: no repeats
    assert ids == [i for r in reference["log"] for i in r["ids"]]

    # 2. The script's own lines, attempt by attempt, in order, with a separator each.
    expected = [(r["step"], f"{r['loss']:.4f}") for r in records]
    for out in (cli(cluster, "logs", job.id), followed,
                cli(cluster, "logs", job.id, "-f")):  # -f on a finished job returns
        parts = sections(out)
        assert len(parts) == 3, out
        for (sep, _), (attempt, region, world) in zip(
                parts, ((1, A, 2), (2, B, 1), (3, C, 2)), strict=True):
            ranks = f"{world} rank{'' if world == 1 else 's'}"  # the ranks that really ran
            # A live follower may get an attempt's header before the agent's ranks report:
            # then it names the GPUs placed (here equal to the ranks) as "world N".
            size = f"(?:{ranks}|world {world})" if out is followed else ranks
            assert re.fullmatch(rf"── attempt {attempt} · {region} · {size} · "
                                r"started \d\d:\d\d:\d\d ──", sep), sep
        shown = [step_lines(lines) for _, lines in parts]
        assert [s for part in shown for s in part] == expected, out
        for part, attempt in zip(shown, (1, 2, 3), strict=True):
            assert [s for s, _ in part] == [r["step"] for r in by_attempt[attempt]]
        assert any("resumed from" in x for x in parts[1][1]), parts[1]
        assert any("resumed from" in x for x in parts[2][1]), parts[2]

    # `brokerctl job` does not claim a restart from 0 for a script that checkpoints.
    shown_job = cli(cluster, "job", job.id)
    assert "restarts from the beginning" not in shown_job, shown_job
    assert os.path.getsize(final) > 0
