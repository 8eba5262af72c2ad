"""End to end: the trainer's own stdout reaches `brokerctl logs`, across a relaunch.

Real broker, agent and trainer processes. A rank is SIGKILLed after the first durable
checkpoint: the agent reports the gang failure blaming that node, the broker relaunches
attempt 2 in the other region (resuming from the checkpoint), and both attempts' lines come back from `brokerctl logs` in order, each
after its separator; a `brokerctl logs -f` started while attempt 1 ran shows the same
and ends by itself when the job finishes.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import ROOT, Cluster, wait_until

pytestmark = pytest.mark.slow


def kill_rank(root: Path, job_id: str, rank: int) -> int:
    """SIGKILL one trainer rank of a job (found by its environment); return its pid."""
    want = [f"CB_JOB_ID={job_id}".encode(), f"RANK={rank}".encode(), str(root).encode()]
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            env = (pid_dir / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(any(w == e or (w.startswith(b"/") and w in e) for e in env) for w in want):
            os.kill(int(pid_dir.name), signal.SIGKILL)
            return int(pid_dir.name)
    raise AssertionError(f"no rank {rank} of {job_id} running")


def brokerctl(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
    return subprocess.Popen([sys.executable, "-m", "brokerctl", "--broker", cluster.address, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(ROOT))


def sections(out: str) -> list[tuple[str, list[str]]]:
    """Split `brokerctl logs` output into (separator, lines) per attempt."""
    result: list[tuple[str, list[str]]] = []
    for line in out.splitlines():
        if line.startswith("── attempt"):
            result.append((line, []))
        elif result:
            result[-1][1].append(line)
    return result


def test_trainer_output_in_brokerctl_logs_across_a_relaunch(cluster: Cluster) -> None:
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=2, gpus=1)
    with cluster.client() as client:
        client.set_team_quota(team="ml", guaranteed_gpus=16)
        wait_until(lambda: any(r.connected for r in client.regions()), timeout=90,
                   what=f"agent connected\n{cluster.logs()}")
        s = pb.JobSpec(name="logs", team="ml", priority_class="training",
                       resources=pb.Resources(nodes=2, gpus_per_node=1),
                       trainer=pb.TrainerSpec(total_steps=40, checkpoint_every=5, global_batch_size=8,
                                              seed=7, model="tiny", step_sleep_s=0.1,
                                              options={"log_every": "1"}))
        handle = client.submit(s)
        wait_until(lambda: handle.status().progress.last_checkpoint_step >= 5, timeout=240,
                   what=f"a durable checkpoint\n{cluster.logs()}")
        cluster.start_agent("eu-west-1", nodes=2, gpus=1)  # where attempt 2 will go
        wait_until(lambda: sum(r.connected for r in client.regions()) == 2, timeout=90,
                   what=f"second agent connected\n{cluster.logs()}")
        follower = brokerctl(cluster, "logs", handle.id, "-f")
        wait_until(lambda: any(r.WhichOneof("kind") == "line" for r in handle.logs()), timeout=60,
                   what=f"attempt 1 output at the broker\n{cluster.logs()}")
        kill_rank(cluster.root, handle.id, 1)
        job = handle.wait(timeout=300)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"
        assert job.attempt == 2, job
        followed, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, err

    done = brokerctl(cluster, "logs", handle.id)
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    parts = sections(out)
    assert [sep.split(" · ")[0] for sep, _ in parts] == ["── attempt 1", "── attempt 2"], out
    for (sep, _), region in zip(parts, ("us-east-2", "eu-west-1"), strict=True):
        assert re.fullmatch(rf"── attempt \d · {region} · 2 ranks · started \d\d:\d\d:\d\d ──", sep)
    first, second = parts[0][1], parts[1][1]
    assert any("(rank 0) trainer: starting fresh" in x for x in first), out
    assert any(re.search(r"\(rank 0\) trainer: step \d+/40 loss", x) for x in first), out
    assert any("(rank 0) trainer: resumed from" in x for x in second), out
    assert any("(rank 0) trainer: step 40/40" in x for x in second), out
    assert any("(rank 0) trainer: done: 40 steps" in x for x in second), out
    steps = [int(m.group(1)) for x in second if (m := re.search(r"trainer: step (\d+)/40", x))]
    assert steps == sorted(steps) and steps[-1] == 40, steps  # in order, none twice
    assert len(steps) == len(set(steps))
    assert sections(followed) == parts, "\n".join(difflib.unified_diff(
        out.splitlines(), followed.splitlines(), "afterwards", "followed", lineterm=""))

    only = brokerctl(cluster, "logs", handle.id, "--attempt", "2", "--rank", "0", "--tail", "1")
    out, err = only.communicate(timeout=120)
    assert only.returncode == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("── attempt 2 ·") and len(lines) == 2, out
    assert "(rank" not in lines[1] and "done: 40 steps" in lines[1], out

    events = brokerctl(cluster, "events", handle.id)
    out, err = events.communicate(timeout=120)
    assert events.returncode == 0, err
    assert re.search(r"^\d\d:\d\d:\d\d launched .*#2", out, re.M), out
