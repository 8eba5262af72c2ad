"""Make-before-break with real trainer processes (torch.distributed, gloo) and moto S3.

The destination attempt is started in standby (CB_STANDBY_GO_FILE) while the source
trains; the source is stopped, the handoff decider (broker/jobs/handoff.py) names the
checkpoint, the go file is written, and the destination loads straight from the source's
directory. Checked on per-step records (the shared sample log, one line per step in the
order the steps happened), never on wall-clock thresholds:
* a failed final checkpoint: the destination resumes from the newest durable one, at
  exactly its next sample, on another world size, after every source step;
* a standby told to abort exits without a step or a save.
The successful handoff through the broker and agents is tests/e2e/test_mbb.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from broker.jobs.handoff import GoAction, SourceEnd, decide
from tests.trainer.launch import launch, read_log, tiny_spec
from trainer.sampler import ResumableSampler
from trainer.standby import Go, write_go
from trainer.standby import GoAction as TrainerGo

TOTAL = 100


def reference_ids(steps: int) -> list[list[int]]:
    """The samples of steps 1..steps of an uninterrupted run (the sampler is pure)."""
    s = ResumableSampler(65536, global_batch=16, seed=7, micro_batch=4)
    return [s.next().ids for _ in range(steps)]


def wait_for(pred: Any, what: str, run_outputs: Any, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{run_outputs()}")


def go_from(decision: Any) -> Go:
    assert decision.action is GoAction.GO, decision
    return Go(TrainerGo.GO, decision.resume_from, decision.reason)


def check_handoff(log: Path, src_world: int, dst_world: int, resume_step: int) -> list[dict]:
    recs = read_log(log)
    attempts = [r["attempt"] for r in recs]
    # every source step was logged before the first destination step (fenced first)
    assert attempts == sorted(attempts) and set(attempts) == {1, 2}, attempts
    src = [r for r in recs if r["attempt"] == 1]
    dst = [r for r in recs if r["attempt"] == 2]
    assert [r["step"] for r in src] == list(range(1, len(src) + 1))
    assert [r["step"] for r in dst] == list(range(resume_step + 1, TOTAL + 1))
    assert {r["world_size"] for r in src} == {src_world}
    assert {r["world_size"] for r in dst} == {dst_world}
    ref = reference_ids(TOTAL)
    for r in recs:  # exactly the samples an uninterrupted run sees at that step
        assert r["ids"] == ref[r["step"] - 1], f"attempt {r['attempt']} step {r['step']}"
    return dst


def test_failed_final_checkpoint_resumes_from_the_newest_durable_one(
    s3_server: Any, tmp_path: Path
) -> None:
    bucket = s3_server.unique_bucket("mbbfail")
    log, go, fence = tmp_path / "steps.jsonl", tmp_path / "go.json", tmp_path / "fenced"
    spec = tiny_spec(total_steps=TOTAL, checkpoint_every=5, step_sleep_s=0.1,
                     options={"sample_log": str(log), "async_checkpoint": "false"})
    src: Any = None
    dst = launch(tmp_path / "dst", 2, {**spec, "step_sleep_s": 0.0},
                 f"s3://{bucket}/j/attempt-2", env={**s3_server.env, "CB_STANDBY_GO_FILE": str(go)},
                 attempt=2)
    try:
        wait_for(lambda: (dst.progress() or {}).get("state") == "standby", "standby", dst.output)
        # the source starts now (after the standby is parked, so a slow standby start on
        # a busy machine cannot let the source finish first); it trains while we wait
        src = launch(tmp_path / "src", 1, spec, f"s3://{bucket}/j/attempt-1",
                     env={**s3_server.env, "CB_FENCE_FILE": str(fence)}, attempt=1)
        outs = lambda: src.output() + dst.output()  # noqa: E731
        wait_for(lambda: ((src.progress() or {}).get("last_checkpoint_step") or 0) >= 5,
                 "a periodic checkpoint", outs)
        fence.touch()  # the final save can no longer commit (as if the store refused it)
        src.signal(signal.SIGTERM)
        assert src.wait(180) == [79], src.output()  # a save that cannot commit (contracts §1)
        assert "superseded" in src.stderr(0)
        durable = src.progress()
        assert durable is not None
        c = durable["last_checkpoint_step"]
        last_src_step = max(r["step"] for r in read_log(log))
        d = decide(SourceEnd.FAILED, final_uri="", durable_uri=durable["last_checkpoint_uri"])
        assert d.resume_from.endswith(f"step-{c:09d}")
        write_go(go, go_from(d))
        assert dst.wait(180) == [0, 0], dst.output()
    finally:
        if src is not None:
            src.kill()
        dst.kill()
    assert c % 5 == 0 and c <= last_src_step
    check_handoff(log, 1, 2, c)
    assert "saved on 1 ranks, loaded on 2" in dst.output(0)


def test_standby_told_to_abort_exits_without_a_step_or_a_save(
    s3_server: Any, tmp_path: Path
) -> None:
    bucket = s3_server.unique_bucket("mbbabort")
    go = tmp_path / "go.json"
    log = tmp_path / "steps.jsonl"
    dst = launch(tmp_path / "dst", 1, tiny_spec(total_steps=TOTAL, options={"sample_log": str(log)}),
                 f"s3://{bucket}/j/attempt-2", env={**s3_server.env, "CB_STANDBY_GO_FILE": str(go)},
                 attempt=2)
    try:
        wait_for(lambda: (dst.progress() or {}).get("state") == "standby", "standby", dst.output)
        d = decide(SourceEnd.FINISHED, final_uri="", durable_uri="")
        assert d.action is GoAction.ABORT
        write_go(go, Go(TrainerGo.ABORT, reason=d.reason))
        assert dst.wait(120) == [143], dst.output()
    finally:
        dst.kill()
    assert not log.exists()
    assert s3_server.list_keys(bucket, "j/") == []
    assert "no step taken, nothing saved" in dst.output(0)
