"""A store that goes down while the ranks resume: they agree, wait together, continue.

Real `python -m trainer` ranks (2, gloo) and moto's S3 server behind a proxy whose port
really refuses connections during the outage. The outage starts exactly at rank 0's
listing of its own checkpoint directory (the removal of a previous attempt's incomplete
saves), which only rank 0 does, after both ranks loaded the checkpoint: rank 1 is
already in the next collective. The fault campaign (s3_refused) saw this end with rank 0
exiting 81 and rank 1 crashing in gloo ("Connection closed by peer", a traceback).

Now every store-touching part of the resume ends with the ranks agreeing on its outcome
(trainer/agree.py), and they wait out the outage together for at most CB_STORE_WAIT_S
(trainer/outage_wait.py): the run continues at the exact next sample, with the same
samples and losses at every step as an uninterrupted run; with no budget left both
ranks exit 81 with one line each and a relaunch resumes the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy
from tests.trainer.launch import assert_clean, launch, read_log, reference_run, tiny_spec
from trainer.storage import step_name

pytestmark = pytest.mark.slow

STEPS, EVERY, RESUME_AT = 12, 4, 4
OUTAGE_S = 8.0


def spec(log: Path) -> dict[str, Any]:
    return tiny_spec(total_steps=STEPS, checkpoint_every=EVERY, options={"sample_log": str(log)})


def own_listing(prefix: str):  # noqa: ANN201 - a FaultPlan.outage_when predicate
    """ListObjectsV2 of the run's own step directories (rank 0's drop_incomplete; the
    resume itself lists the *other* prefix, CB_RESUME_FROM's)."""
    needle = f"list-type=2&prefix={prefix}%2Fstep-"
    return lambda method, path: method == "GET" and needle in path


@pytest.fixture(scope="module")
def reference(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run on 2 ranks; its step-4 checkpoint is what the others resume."""
    return reference_run(s3_server, tmp_path_factory.mktemp("resume-outage"), spec, STEPS)


def assert_same_as_reference(ref: list[dict[str, Any]], log: Path) -> None:
    """Steps RESUME_AT+1..STEPS: the same sample ids and bit-identical losses."""
    got = read_log(log)
    assert [r["step"] for r in got] == list(range(RESUME_AT + 1, STEPS + 1)), got
    by_step = {r["step"]: r for r in ref}
    for rec in got:
        assert rec["ids"] == by_step[rec["step"]]["ids"], f"step {rec['step']}: other samples"
        assert rec["loss"] == by_step[rec["step"]]["loss"], f"step {rec['step']}: loss differs"


def test_ranks_wait_out_an_outage_during_resume_together(
        s3_server: Any, reference: dict[str, Any]) -> None:
    bucket, work = reference["bucket"], reference["work"]
    log = work / "waited.jsonl"
    plan = FaultPlan(outage_when=own_listing("waited"), outage_s=OUTAGE_S)
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        run = launch(work / "waited", 2, spec(log), f"s3://{bucket}/waited",
                     env={**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url,
                          "CB_STORE_WAIT_S": "120"},
                     resume_from=f"s3://{bucket}/ref/{step_name(RESUME_AT)}")
        codes = run.wait(300)
        assert len(plan.outages) == 1 and plan.outages[0][1] > 0, plan.outages
        down, up = plan.outages[0]
        assert up - down >= OUTAGE_S
    assert codes == [0, 0], f"{codes}\n{run.output()}\n{run.stderr(0)}\n{run.stderr(1)}"
    assert_clean(run)
    out = run.output(0)
    assert "checkpoint store unreachable while resuming" in out, out
    assert "every rank waits" in out and "answered again after" in out, out
    assert_same_as_reference(reference["log"], log)
    prog = run.progress()
    assert prog is not None and prog["state"] == "done" and prog["step"] == STEPS


def test_ranks_exit_81_together_when_the_wait_budget_is_spent(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """No budget (CB_STORE_WAIT_S=0): both ranks exit 81, one line each, no gloo crash;
    the relaunch the broker makes once the store is back continues at the next sample."""
    bucket, work = reference["bucket"], reference["work"]
    log = work / "relaunched.jsonl"
    plan = FaultPlan(outage_when=own_listing("relaunched"), outage_s=OUTAGE_S)
    resume = f"s3://{bucket}/ref/{step_name(RESUME_AT)}"
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        env = {**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url, "CB_STORE_WAIT_S": "0"}
        run = launch(work / "gave-up", 2, spec(log), f"s3://{bucket}/relaunched", env=env,
                     resume_from=resume)
        codes = run.wait(300)
        assert codes == [81, 81], f"{codes}\n{run.output()}\n{run.stderr(0)}\n{run.stderr(1)}"
        assert_clean(run)
        assert "unreachable" in run.stderr(0), run.stderr(0)
        assert "unreachable" in run.stderr(1) and "reported by rank 0" in run.stderr(1), \
            run.stderr(1)
        assert not log.exists() or not read_log(log), "a step was taken during the outage"
        while not plan.outages[0][1]:  # the store comes back; the broker relaunches
            import time

            time.sleep(0.2)
        again = launch(work / "relaunch", 2, spec(log), f"s3://{bucket}/relaunched", env=env,
                       resume_from=resume, attempt=1)
        codes = again.wait(300)
    assert codes == [0, 0], f"{codes}\n{again.output()}\n{again.stderr(0)}\n{again.stderr(1)}"
    assert_clean(again)
    assert_same_as_reference(reference["log"], log)


def test_ranks_agree_on_an_outage_only_one_of_them_saw_at_start(
        s3_server: Any, tmp_path: Path) -> None:
    """Rank 1's store endpoint refuses, rank 0's answers: before, rank 1 exited 81 at its
    start-up probe and rank 0 waited for it in the rendezvous until a timeout traceback.
    Now the probe's outage is agreed once the process group exists: both exit 81."""
    from tests.trainer.launch import free_port

    bucket = s3_server.unique_bucket("start-outage")
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    run = launch(tmp_path / "run", 2, spec(tmp_path / "s.jsonl"), f"s3://{bucket}/run",
                 env={**s3_server.env, "CB_STORE_WAIT_S": "0"},
                 rank_env={1: {"AWS_ENDPOINT_URL": dead}})
    codes = run.wait(240)
    assert codes == [81, 81], f"{codes}\n{run.output()}\n{run.stderr(0)}\n{run.stderr(1)}"
    assert_clean(run)
    assert dead in run.stderr(1), run.stderr(1)
    assert dead in run.stderr(0) and "reported by rank 1" in run.stderr(0), run.stderr(0)


def test_ranks_wait_out_an_outage_at_start_together(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """The store refuses from the first start-up probe on for OUTAGE_S: the ranks build
    the model meanwhile, wait for the store together in the resume and then train
    exactly the uninterrupted run's steps."""
    bucket, work = reference["bucket"], reference["work"]
    log = work / "started.jsonl"
    plan = FaultPlan(outage_when=lambda m, p: "max-keys=1" in p and "prefix=started" in p,
                     outage_s=OUTAGE_S)
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        run = launch(work / "started", 2, spec(log), f"s3://{bucket}/started",
                     env={**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url,
                          "CB_STORE_WAIT_S": "120"})
        codes = run.wait(300)
        assert len(plan.outages) == 1, plan.outages
    assert codes == [0, 0], f"{codes}\n{run.output()}\n{run.stderr(0)}\n{run.stderr(1)}"
    assert_clean(run)
    out = run.output(0)
    assert "checkpoint store unreachable while starting" in out, out
    # The model is built during the outage; the resume is what waits for the store.
    assert "building the model meanwhile" in out, out
    assert "answered again after" in out and "resumed at step 0" in out, out
    got = read_log(log)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), got
    assert [(r["ids"], r["loss"]) for r in got] == \
        [(r["ids"], r["loss"]) for r in reference["log"]]
