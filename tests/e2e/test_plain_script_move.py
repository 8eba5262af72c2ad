"""A plain script (no library, no checkpoints) with a workdir, moved by a region drain.

Real broker, two real agents (regions), real script processes. The job must land in
the other region with the same workdir bytes, start again from its beginning (nothing
to resume from: CB_RESUME_FROM empty), and `brokerctl job` must say so plainly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import Cluster, wait_until

pytestmark = pytest.mark.slow

SCRIPT = '''
import json, os, time
attempt = os.environ["CB_ATTEMPT"]
with open(f"started-{attempt}.json", "w") as f:
    json.dump({"resume_from": os.environ["CB_RESUME_FROM"], "first_step": 0,
               "region_file": open("data.txt").read()}, f)
for step in range(600):
    print("step", step, flush=True)
    time.sleep(0.2)
'''


def attempt_dir(cluster: Cluster, region: str, job_id: str, attempt: int) -> Path:
    return cluster.root / "agents" / region / "jobs" / job_id / f"attempt-{attempt}"


def test_plain_script_restarts_from_zero_in_the_other_region(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    cluster.start_broker()
    for region in ("us-east-2", "us-west-2"):
        cluster.start_agent(region, nodes=1, gpus=1)
    code = tmp_path / "code"
    code.mkdir()
    (code / "loop.py").write_text(SCRIPT)
    (code / "data.txt").write_text("same bytes everywhere")
    with cluster.client() as client:
        wait_until(lambda: len(client.regions()) == 2, 120, what="two regions")
        client.set_team_quota(team="ml", guaranteed_gpus=8)
        # A plain script has no progress file: the agent calls it RUNNING once it has
        # lived startup_timeout_s (default 30 s, twice here); 1 s is the same path.
        h = client.submit({"name": "plain", "team": "ml", "workdir": str(code),
                           "run": ["python", "loop.py"],
                           "trainer": {"options": {"startup_timeout_s": "1"}}})
        job = wait_until(lambda: (j := h.status()).phase == pb.JOB_PHASE_RUNNING and j, 180,
                         what=f"job running\n{cluster.logs()}")
        first = job.placement.region
        other = "us-west-2" if first == "us-east-2" else "us-east-2"
        a1 = attempt_dir(cluster, first, h.id, job.attempt)
        wait_until(lambda: (a1 / "workdir" / f"started-{job.attempt}.json").exists(), 120,
                   what="the script to start")
        client.drain(first, reason="maintenance")
        moved = wait_until(
            lambda: (j := h.status()).phase == pb.JOB_PHASE_RUNNING and j.attempt > job.attempt
            and j, 180, what=f"the job to run again\n{cluster.logs()}")
        assert moved.placement.region == other
        a2 = attempt_dir(cluster, other, h.id, moved.attempt)
        started = wait_until(
            lambda: json.loads((a2 / "workdir" / f"started-{moved.attempt}.json").read_text()),
            120, what="the script to start again")
        assert started == {"resume_from": "", "first_step": 0,
                           "region_file": "same bytes everywhere"}
        code1, code2 = (d / "workdir" / "loop.py" for d in (a1, a2))
        assert code2.read_bytes() == code1.read_bytes()
        assert not (a2 / "workdir" / f"started-{job.attempt}.json").exists()  # fresh copy
        shown = subprocess.run(
            [sys.executable, "-m", "brokerctl", "--broker", cluster.address, "job", h.id],
            capture_output=True, text=True, timeout=60, env=cluster.env())
        assert "no checkpoint: this job restarts from the beginning" in shown.stdout
        client.cancel(h.id)
        wait_until(lambda: h.status().phase == pb.JOB_PHASE_CANCELLED, 120, what="cancel")
