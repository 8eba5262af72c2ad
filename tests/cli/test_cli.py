"""`brokerctl` in-process (brokerctl.main.main) and once as a real subprocess, against a
real broker on loopback. Errors must be one readable line, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import TEAM, run_cli

ROOT = Path(__file__).resolve().parents[2]
JOB_ID = re.compile(r"submitted job (\S+)")


run = run_cli  # the one in-process brokerctl runner (tests/cli/conftest.py)


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.delenv("BROKER_ADDRESS", raising=False)


def submit(capsys, addr: str, *extra: str) -> str:
    rc, out, err = run(capsys, "--broker", addr, "submit", "--name", "cli-job", "--team", TEAM,
                       "--steps", "10", "--checkpoint-every", "5", *extra)
    assert rc == 0, err
    m = JOB_ID.search(out)
    assert m, out
    return m.group(1)


def assert_one_error_line(err: str, out: str = "") -> None:
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err


def test_submit_jobs_job_cancel(capsys, broker_address: str) -> None:
    job_id = submit(capsys, broker_address, "--nodes", "2", "--gpus-per-node", "4",
                    "--topology-preferred", "layer-3", "--prefer-region", "us-east-2")
    rc, out, _ = run(capsys, "--broker", broker_address, "jobs", "--team", TEAM)
    assert rc == 0 and job_id in out and "2×4" in out and "pending" in out

    rc, out, _ = run(capsys, "--broker", broker_address, "jobs", "-o", "json")
    assert rc == 0
    assert job_id in {j["id"] for j in json.loads(out)}

    rc, out, _ = run(capsys, "--broker", broker_address, "job", job_id)
    assert rc == 0
    assert job_id in out and "events" in out and "submitted" in out

    rc, out, _ = run(capsys, "--broker", broker_address, "job", job_id, "-o", "json")
    assert rc == 0 and json.loads(out)["job"]["id"] == job_id

    rc, out, _ = run(capsys, "--broker", broker_address, "events", job_id)
    assert rc == 0 and "submitted" in out and re.search(r"^\d\d:\d\d:\d\d submitted ", out, re.M)

    rc, out, _ = run(capsys, "--broker", broker_address, "logs", job_id, "--tail", "5")
    assert rc == 0 and f"no output from {job_id} yet" in out

    rc, out, err = run(capsys, "--broker", broker_address, "logs", job_id, "--rank", "-1")
    assert rc == 2 and "rank must be >= 0" in err + out
    assert_one_error_line(err, out)

    rc, out, err = run(capsys, "--broker", broker_address, "logs", "j-nope")
    assert rc == 2
    assert_one_error_line(err, out)

    rc, out, _ = run(capsys, "--broker", broker_address, "cancel", job_id, "--reason", "test")
    assert rc == 0 and "cancelled" in out

    # Cancelling again: the server's FAILED_PRECONDITION is bad input -> exit 2, one line.
    rc, out, err = run(capsys, "--broker", broker_address, "cancel", job_id)
    assert rc == 2
    assert_one_error_line(err, out)

    # watch on a finished job prints its history and the final phase.
    rc, out, _ = run(capsys, "--broker", broker_address, "watch", job_id)
    assert "final: cancelled" in out


def test_submit_from_spec_file_with_override(capsys, broker_address: str) -> None:
    spec = ROOT / "examples" / "spec.yaml"
    rc, out, err = run(capsys, "--broker", broker_address, "submit", "-f", str(spec),
                       "--team", TEAM, "--name", "from-file")
    assert rc == 0, err
    job_id = JOB_ID.search(out).group(1)  # type: ignore[union-attr]
    rc, out, _ = run(capsys, "--broker", broker_address, "job", job_id, "-o", "json")
    job = json.loads(out)["job"]
    assert job["spec"]["name"] == "from-file" and job["spec"]["team"] == TEAM
    run(capsys, "--broker", broker_address, "cancel", job_id)


@pytest.mark.parametrize(("flags", "types"), [
    ([], {"CAPACITY_TYPE_ON_DEMAND", "CAPACITY_TYPE_SPOT", "CAPACITY_TYPE_TRAINING_PLAN",
          "CAPACITY_TYPE_RESERVED"}),  # the file's spot_ok: any type, spot included
    (["--capacity-type", "on-demand,training-plan"],
     {"CAPACITY_TYPE_ON_DEMAND", "CAPACITY_TYPE_TRAINING_PLAN"}),  # the flag's exact set
    (["--capacity-type", "on-demand", "--spot"], {"CAPACITY_TYPE_ON_DEMAND", "CAPACITY_TYPE_SPOT"}),
])
def test_capacity_type_flag_is_the_exact_set_over_a_files_spot_ok(
        capsys, broker_address: str, flags: list[str], types: set[str]) -> None:
    spec = ROOT / "examples" / "spec.yaml"  # says spot_ok: true
    rc, out, err = run(capsys, "--broker", broker_address, "submit", "-f", str(spec),
                       "--team", TEAM, *flags)
    assert rc == 0, err
    job_id = JOB_ID.search(out).group(1)  # type: ignore[union-attr]
    rc, out, _ = run(capsys, "--broker", broker_address, "job", job_id, "-o", "json")
    assert set(json.loads(out)["job"]["spec"]["capacity_types"]) == types
    run(capsys, "--broker", broker_address, "cancel", job_id)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpus-per-node", "0"], "gpus_per_node"),                  # zero GPUs
        (["--team", "no-such-team"], "no-such-team"),                 # unknown team
        (["--checkpoint-uri", "relative/dir"], "checkpoint_uri"),     # bad URI
        (["--gpus-per-node", "100000"], "gpus_per_node"),             # too many GPUs
        (["--topology-required", "rack"], "rack"),                    # bad level (client side)
        (["--nodes", "two"], "--nodes"),                              # not a number (argparse)
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, broker_address: str, flags: list[str],
                                         needle: str) -> None:
    argv = ["--broker", broker_address, "submit", "--name", "bad", "--team", TEAM, *flags]
    rc, out, err = run(capsys, *argv)
    assert rc == 2, (out, err)
    assert_one_error_line(err, out)
    assert needle in err


def test_unknown_job_is_bad_input(capsys, broker_address: str) -> None:
    rc, out, err = run(capsys, "--broker", broker_address, "job", "j-nope")
    assert rc == 2
    assert_one_error_line(err, out)


def test_missing_spec_file(capsys, broker_address: str, tmp_path: Path) -> None:
    rc, out, err = run(capsys, "--broker", broker_address, "submit", "-f", str(tmp_path / "x.yaml"))
    assert rc == 2
    assert_one_error_line(err, out)


def test_broker_down_names_the_address(capsys, dead_address: str) -> None:
    rc, out, err = run(capsys, "--broker", dead_address, "jobs")
    assert rc == 1
    assert_one_error_line(err, out)
    assert dead_address in err


def test_broker_address_from_env(capsys, monkeypatch, broker_address: str) -> None:
    monkeypatch.setenv("BROKER_ADDRESS", broker_address)
    rc, out, err = run(capsys, "teams")
    assert rc == 0, err
    assert TEAM in out


def test_teams_set_and_list(capsys, broker_address: str) -> None:
    rc, out, err = run(capsys, "--broker", broker_address, "teams", "set", "cli-team",
                       "--cohort", "ml", "--guaranteed", "8:h100", "--guaranteed", "4",
                       "--borrow-limit", "4", "--strategy", "lend-and-borrow")
    assert rc == 0, err
    rc, out, _ = run(capsys, "--broker", broker_address, "teams", "-o", "json")
    team = next(t for t in json.loads(out) if t["team"] == "cli-team")
    assert {q.get("accelerator", "") for q in team["quotas"]} == {"h100", ""}
    rc, out, _ = run(capsys, "--broker", broker_address, "teams")
    assert "cli-team" in out and "COHORT" in out


def test_operator_views_run(capsys, broker_address: str) -> None:
    for argv in (["regions"], ["capacity"], ["capacity", "--by-block", "--nodes"],
                 ["plans"], ["plans", "list", "--all"]):
        rc, out, err = run(capsys, "--broker", broker_address, *argv)
        assert rc == 0, (argv, err)
        assert "Traceback" not in out + err


def test_jobs_table_headers_fit_100_columns(capsys, broker_address: str) -> None:
    submit(capsys, broker_address, "--name", "a-rather-long-job-name-that-needs-eliding-" * 2)
    rc, out, _ = run(capsys, "--broker", broker_address, "jobs")
    assert rc == 0
    header = next(line for line in out.splitlines() if "PHASE" in line)
    for col in ("ID", "NAME", "TEAM", "PHASE", "REGION", "SHAPE", "STEP", "R/M", "AGE", "REASON"):
        assert col in header, header
    assert all(len(line) <= 100 for line in out.splitlines())


def test_serve_rejects_bad_settings(capsys) -> None:
    rc, out, err = run(capsys, "serve", "--scheduler-interval", "-1")
    assert rc == 2
    assert_one_error_line(err, out)
    assert "scheduler_interval_s" in err
    rc, out, err = run(capsys, "serve", "--set", "no_such_field=1")
    assert rc == 2 and "no_such_field" in err


def test_real_brokerctl_subprocess(broker_address: str) -> None:
    exe = Path(sys.executable).parent / "brokerctl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "brokerctl"]
    env = {**os.environ, "COLUMNS": "100", "BROKER_ADDRESS": broker_address}
    ok = subprocess.run([*cmd, "jobs"], capture_output=True, text=True, env=env, cwd=ROOT,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*cmd, "submit", "--name", "sub", "--team", TEAM, "--gpus-per-node", "0"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert bad.returncode == 2
    assert "Traceback" not in bad.stdout + bad.stderr
    assert bad.stderr.startswith("error: ")
