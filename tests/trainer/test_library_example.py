"""The library from a user's script: examples/byo/train_plain.py as real gloo processes.

An uninterrupted 2-rank run is the reference. A run SIGTERMed mid-way (exit 75, the
library's emergency checkpoint) and resumed on another world size (2 -> 1, 1 -> 2)
must train on exactly the reference's samples, match its loss at every step within
the resharding tolerance of test_trainer_processes.py, and end with the same model.
Also issue 15: no checkpoint before the first optimizer step (defect 5) and the real
final loss after a resume at the last step (defect 8).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.launch import REPO, Run, launch, read_log
from tests.trainer.test_trainer_processes import REL_TOL, assert_matches
from trainer.storage import step_name

pytestmark = pytest.mark.slow
SCRIPT = str(REPO / "examples" / "byo" / "train_plain.py")
STEPS = 40


def run_example(
    workdir: Path, world: int, ckpt: Path, log: Path, *, attempt: int = 0, sleep: float = 0.0,
    export: Path | None = None, steps: int = STEPS,
) -> Run:
    argv = [SCRIPT, "--steps", str(steps), "--checkpoint-every", "10", "--loss-log", str(log),
            "--step-sleep", str(sleep)]
    if export is not None:
        argv += ["--export", str(export)]
    return launch(workdir, world, "{}", str(ckpt), attempt=attempt, argv=argv, job_id="j-byo")


def wait_codes(run: Run, expect: int, timeout: float = 240) -> None:
    codes = run.wait(timeout)
    assert codes == [expect] * len(codes), f"exit codes {codes}\n{run.output()}\n{run.stderr()}"


def wait_step(run: Run, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        prog = run.progress()
        if prog and prog.get("step", 0) >= step:
            return
        if any(p.poll() is not None for p in run.procs):
            raise AssertionError(f"exited early\n{run.output()}\n{run.stderr()}")
        time.sleep(0.05)
    run.kill()
    raise AssertionError(f"step {step} not reached in {timeout}s")


def assert_same_model(a: Path, b: Path) -> None:
    sa, sb = torch.load(a), torch.load(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k], sb[k], rtol=REL_TOL, atol=1e-6), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("byo-ref")
    run = run_example(d / "run", 2, d / "ckpt", d / "loss.jsonl", export=d / "final.pt")
    wait_codes(run, 0)
    log = read_log(d / "loss.jsonl")
    assert [r["step"] for r in log] == list(range(1, STEPS + 1))
    assert log[-1]["loss"] < log[0]["loss"] * 0.8, "the example does not learn"
    return {"dir": d, "log": log, "final": d / "final.pt", "run": run}


@pytest.mark.parametrize(("first", "second"), [(2, 1), (1, 2)])
def test_sigterm_then_resume_on_other_world_size_matches_reference(
    tmp_path: Path, reference: dict[str, Any], first: int, second: int
) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "loss.jsonl"
    a1 = run_example(tmp_path / "a1", first, ckpt, log, attempt=1, sleep=0.1)
    wait_step(a1, 13)
    a1.signal(signal.SIGTERM)
    wait_codes(a1, 75, timeout=120)
    prog = a1.progress()
    stopped = prog["step"]
    assert stopped >= 13 and prog["last_checkpoint_step"] == stopped, prog
    manifest = json.loads((ckpt / step_name(stopped) / "manifest.json").read_text())
    assert manifest["world_size"] == first and manifest["samples_seen"] == stopped * 32
    assert manifest["loss"] == read_log(log)[-1]["loss"]  # issue 15 defect 8
    assert "stopped at step" in a1.output(0)

    a2 = run_example(tmp_path / "a2", second, ckpt, log, attempt=2, export=tmp_path / "final.pt")
    wait_codes(a2, 0)
    assert f"saved on {first} ranks, loaded on {second}" in a2.output(0)
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1)), "a step lost or repeated"
    assert_matches(reference["log"], records, exact=first == second == 2)
    assert_same_model(reference["final"], tmp_path / "final.pt")
    done = a2.progress()
    assert (done["state"], done["step"], done["attempt"]) == ("done", STEPS, 2)


def test_resume_at_last_step_reports_the_real_final_loss(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """Issue 15 defect 8: an attempt that resumes at total_steps has no step to run; its
    progress must still carry the final loss (from the manifest), not 0 or null."""
    run = run_example(tmp_path / "again", 1, reference["dir"] / "ckpt", tmp_path / "l.jsonl")
    wait_codes(run, 0)
    prog = run.progress()
    assert (prog["state"], prog["step"]) == ("done", STEPS)
    assert prog["loss"] == reference["log"][-1]["loss"]
    assert prog["last_checkpoint_step"] == STEPS
    assert not (tmp_path / "l.jsonl").exists(), "no step should have run"


def test_sigterm_before_the_first_step_saves_no_step_0_checkpoint(tmp_path: Path) -> None:
    """Issue 15 defect 5: a stop requested while the script is still starting trains one
    real step and checkpoints it; a step-0 checkpoint (a never-stepped AdamW, whose
    saved `step` would be 1) is never written."""
    ckpt = tmp_path / "ckpt"
    run = run_example(tmp_path / "run", 1, ckpt, tmp_path / "l.jsonl", sleep=0.5)
    deadline = time.monotonic() + 120
    while run.progress() is None:  # the progress file appears in init(), before any step
        assert time.monotonic() < deadline and run.procs[0].poll() is None, run.output()
        time.sleep(0.01)
    run.signal(signal.SIGTERM)
    wait_codes(run, 75, timeout=120)
    dirs = sorted(p.name for p in ckpt.iterdir())
    assert step_name(0) not in dirs
    assert dirs and all((ckpt / d / "manifest.json").is_file() for d in dirs), dirs
    assert int(dirs[-1].split("-")[1]) >= 1


def _plain_env() -> dict[str, str]:
    """No broker: no CB_* variables, no torchrun variables."""
    drop = ("CB_", "AWS_", "RANK", "WORLD_SIZE", "LOCAL_", "MASTER_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return env


def test_outside_the_broker_checkpoints_locally_and_resumes(tmp_path: Path) -> None:
    """A script run by hand (no CB_* env, one process) checkpoints into ./checkpoints
    and a second run resumes from there instead of starting over."""
    cmd = [sys.executable, SCRIPT, "--steps", "12", "--checkpoint-every", "5"]
    first = subprocess.run(cmd, cwd=tmp_path, env=_plain_env(), capture_output=True, text=True,
                           timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == [step_name(5), step_name(10), step_name(12)]
    again = subprocess.run(cmd[:3] + ["20"] + cmd[4:], cwd=tmp_path, env=_plain_env(),
                           capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from {tmp_path / 'checkpoints' / step_name(12)}" in again.stdout
    assert (tmp_path / "checkpoints" / step_name(20) / "manifest.json").is_file()


@pytest.mark.parametrize("case", ["resume-gone", "foreign-checkpoint"])
def test_library_errors_exit_with_the_contract_code_and_one_line(
    tmp_path: Path, reference: dict[str, Any], case: str
) -> None:
    """Errors inside the script's library calls end it as docs/contracts.md says, with
    one stderr line and no traceback: CB_RESUME_FROM gone -> 77 (the broker relaunches);
    a checkpoint whose manifest names another model (its fingerprint differs) -> 2."""
    env = _plain_env()
    if case == "resume-gone":
        env["CB_RESUME_FROM"] = str(tmp_path / "nowhere" / step_name(7))
        expect, needle = 77, "is not a complete checkpoint"
    else:
        ckpt = tmp_path / "ckpt"
        shutil.copytree(reference["dir"] / "ckpt" / step_name(40), ckpt / step_name(40))
        manifest = ckpt / step_name(40) / "manifest.json"
        m = json.loads(manifest.read_text())
        m["model"]["shapes_sha256"] = "0" * 16
        manifest.write_text(json.dumps(m))
        env["CB_CHECKPOINT_URI"] = str(ckpt)
        expect, needle = 2, "was written for a different model"
    res = subprocess.run([sys.executable, SCRIPT, "--steps", "50"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240)
    assert res.returncode == expect, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert "trainer error (rank 0):" in res.stderr and needle in res.stderr, res.stderr


def test_gpt2_example_learns_and_resumes(tmp_path: Path) -> None:
    """examples/byo/train_gpt2.py (transformers GPT-2 from a config, a BPE tokenizer
    trained on stdlib sources) on 2 ranks: stopped at step 6, resumed on 1 rank with the
    tokenizer checked against the checkpoint's, and its loss falls."""
    gpt2 = str(REPO / "examples" / "byo" / "train_gpt2.py")
    argv = [gpt2, "--steps", "12", "--corpus-mb", "0.3", "--vocab", "512", "--layers", "2",
            "--width", "64", "--seq-len", "64", "--global-batch", "8", "--micro-batch", "4",
            "--checkpoint-every", "4", "--log-every", "1"]
    ckpt = tmp_path / "ckpt"
    a1 = launch(tmp_path / "a1", 2, "{}", str(ckpt), attempt=1, argv=argv)
    wait_step(a1, 6, timeout=300)
    a1.signal(signal.SIGTERM)
    wait_codes(a1, 75, timeout=180)
    a2 = launch(tmp_path / "a2", 1, "{}", str(ckpt), attempt=2, argv=argv)
    wait_codes(a2, 0, timeout=300)
    assert "saved on 2 ranks, loaded on 1" in a2.output(0)
    losses = [float(line.split(" loss ")[1].split()[0])
              for line in (a1.output(0) + a2.output(0)).splitlines() if " loss " in line]
    assert len(losses) >= 10 and losses[-1] < losses[0] - 0.3, losses
    manifest = json.loads((ckpt / step_name(12) / "manifest.json").read_text())
    assert manifest["model"]["n_layer"] == 2 and manifest["loss"] == pytest.approx(losses[-1], abs=1e-3)
