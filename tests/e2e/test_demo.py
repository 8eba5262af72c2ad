"""The README's first command ends in `brokerctl demo`: run it as a user would.

A real subprocess: embedded broker, three agent subprocesses, real trainer ranks.
Small settings keep it to about a minute on two cores; the assertions are the
ones the README promises: every job SUCCEEDED, each on a named region, with
complete checkpoints on disk, and the spot job's story told as a timeline (a notice in
us-west-2, a move to eu-west-1 on half the world size, a resume at the next unseen
sample).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("us-east-2", "us-west-2", "eu-west-1")


def run_demo(work: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="100", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "brokerctl", "demo", "--work-dir", str(work), "--steps", "12",
         "--checkpoint-every", "4", "--ranks-per-node", "1", "--timeout", "400", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )


def test_demo_runs_every_job_to_success(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    result = run_demo(work)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    summary = out[out.rfind("demo summary"):]
    assert "demo summary" in summary, out[-4000:]
    assert summary.lower().count("succeeded") >= 5, summary
    assert any(region in summary for region in REGIONS), summary
    # The headline story, as a timeline: a spot notice in us-west-2, a move to another
    # region on a different world size, a resume at the next unseen sample.
    timeline = out[out.find("the timeline"):out.rfind("demo summary")]
    assert "rl-sweep-spot    NOTICE" in timeline, timeline
    moved = [line for line in timeline.splitlines() if "rl-sweep-spot    MOVED" in line]
    assert len(moved) == 1 and re.search(r"us-west-2 → eu-west-1, ranks \d+ → \d+", moved[0]), timeline
    resumed = [line for line in timeline.splitlines() if "rl-sweep-spot    RESUMED" in line]
    assert len(resumed) == 1 and "the next unseen" in resumed[0], timeline
    step = int(re.search(r"RESUMED +step (\d+)", resumed[0]).group(1))
    sample = int(re.search(r"sample #(\d+)", resumed[0]).group(1))
    assert sample == (step - 1) * 8, resumed  # global batch 8: every earlier sample was seen once
    assert re.search(r"rl-sweep-spot:\n  moved after a spot notice: us-west-2 \d+ ranks? → "
                     r"eu-west-1 \d+ ranks?, resumed at step \d+", out), out[-2000:]
    assert all(len(line) <= 100 for line in timeline.splitlines()), timeline
    # Each job its own seed and batch size: not one shared final loss.
    losses = re.findall(r"final loss (\d+\.\d+)", timeline)
    assert len(losses) == 5 and len(set(losses)) == 5, losses
    manifests = list(work.rglob("manifest.json"))
    assert len(manifests) >= 5, f"expected checkpoints of 5 jobs on disk, found {len(manifests)}"
    # No trainer or agent outlives the demo.
    leftover = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == "", f"processes left behind: {leftover.stdout}"


def test_demo_s3_tells_the_story_with_checkpoints_in_a_local_s3_server(tmp_path: Path) -> None:
    """`brokerctl demo --s3 --jobs 1`: moto's S3 server is started and stopped by the demo,
    one bucket per region; the spot job's checkpoints live there, not on local disk."""
    import socket

    work = tmp_path / "demo"
    result = run_demo(work, "--s3", "--jobs", "1")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    endpoint = re.search(r"S3 API on http://127\.0\.0\.1:(\d+): buckets s3://cb-demo-", out)
    assert endpoint, out[:2000]
    assert re.search(r"rl-sweep-spot +MOVED +us-west-2 → eu-west-1, ranks \d+ → \d+", out), out[-4000:]
    objects = re.search(r"S3: (\d+) objects in the region buckets", out)
    assert objects and int(objects.group(1)) > 0, out[-2000:]
    assert not list((work / "regions").rglob("manifest.json")), "checkpoints went to local disk"
    with socket.socket() as s:  # the demo stopped its S3 server
        assert s.connect_ex(("127.0.0.1", int(endpoint.group(1)))) != 0
