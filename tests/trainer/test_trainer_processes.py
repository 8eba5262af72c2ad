"""The trainer as real processes: `python -m trainer` ranks over gloo, checkpoints in moto S3.

One uninterrupted 2-rank baseline run (40 steps) is the reference. Every other run
resumes from one of its checkpoints (or is stopped and resumed) and must reproduce the
baseline's sample ids exactly and its loss at every step: bit-identical when the world
size is unchanged, within 1e-5 relative when it changes (only float summation order
differs). Also: progress file, SIGTERM/SIGUSR1, half-written and corrupt checkpoints,
wrong model, unreachable S3, a store refusing writes, bad config.
"""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from checkpoint_layout.stop_deadline import StopDeadline, write_stop_deadline
from tests.trainer.launch import free_port, launch, read_log, tiny_spec
from trainer.storage import step_name

pytestmark = pytest.mark.slow
REL_TOL = 1e-5


def assert_matches(baseline: list[dict], run: list[dict], *, exact: bool) -> None:
    """Every step of `run` has the baseline's ids and loss (exact or within REL_TOL)."""
    assert run, "the run logged no steps"
    by_step = {r["step"]: r for r in baseline}
    for rec in run:
        ref = by_step[rec["step"]]
        assert rec["ids"] == ref["ids"], f"step {rec['step']}: different samples"
        if exact:
            assert rec["loss"] == ref["loss"], f"step {rec['step']}: {rec['loss']} != {ref['loss']}"
        else:
            rel = abs(rec["loss"] - ref["loss"]) / abs(ref["loss"])
            assert rel <= REL_TOL, f"step {rec['step']}: loss rel diff {rel:.2e}"


def wait_ok(run: Any, expect: int = 0, timeout: float = 240) -> None:
    codes = run.wait(timeout)
    assert codes == [expect] * len(codes), f"exit codes {codes}\n{run.output()}\n{run.stderr()}"


def copy_prefix(s3: Any, bucket: str, src: str, dst: str, *, skip_manifest: bool = False) -> None:
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix=src + "/")["Contents"]:
        if skip_manifest and obj["Key"].endswith("manifest.json"):
            continue
        s3.copy_object(
            Bucket=bucket,
            Key=dst + obj["Key"][len(src) :],
            CopySource={"Bucket": bucket, "Key": obj["Key"]},
        )


def truncate_object(s3: Any, bucket: str, key: str) -> None:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=body[: len(body) // 2])


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer")


@pytest.fixture(scope="module")
def baseline(s3_server: Any, work: Path) -> dict[str, Any]:
    """40 uninterrupted steps on 2 ranks, a checkpoint every 10 steps to S3 (async)."""
    bucket = s3_server.unique_bucket("trainer")
    log = work / "baseline.jsonl"
    run = launch(
        work / "baseline",
        2,
        tiny_spec(options={"sample_log": str(log)}),
        f"s3://{bucket}/base",
        env=s3_server.env,
        job_id="j-base",
        attempt=3,
    )
    wait_ok(run)
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, 41))
    return {"bucket": bucket, "log": records, "run": run}


@pytest.fixture(scope="module")
def resumed_on_4_hsdp(s3_server: Any, work: Path, baseline: dict[str, Any]) -> dict[str, Any]:
    """Baseline's step-20 checkpoint (2-rank FSDP) resumed on 4 ranks as HSDP 2x2."""
    bucket = baseline["bucket"]
    log = work / "r4.jsonl"
    run = launch(
        work / "r4",
        4,
        tiny_spec(options={"sample_log": str(log), "parallelism": "hsdp", "hsdp_replicate": 2}),
        f"s3://{bucket}/r4",
        env=s3_server.env,
        resume_from=f"s3://{bucket}/base/{step_name(20)}",
    )
    wait_ok(run)
    return {"log": read_log(log), "run": run}


def test_baseline_progress_file_and_manifest(baseline: dict[str, Any], s3_server: Any) -> None:
    prog = baseline["run"].progress()
    bucket = baseline["bucket"]
    assert prog is not None
    assert prog["state"] == "done"
    assert (prog["step"], prog["total_steps"], prog["samples_seen"]) == (40, 40, 640)
    assert (prog["job_id"], prog["attempt"], prog["world_size"]) == ("j-base", 3, 2)
    assert prog["last_checkpoint_step"] == 40
    assert prog["last_checkpoint_uri"] == f"s3://{bucket}/base/{step_name(40)}"
    assert prog["loss"] == baseline["log"][-1]["loss"]
    assert prog["tokens_per_s"] > 0 and prog["heartbeat"] >= prog["time"] - 1
    s3 = s3_server.client()
    keys = s3_server.list_keys(bucket, "base/")
    steps = sorted({k.split("/")[1] for k in keys})
    assert steps == [step_name(s) for s in (10, 20, 30, 40)]
    manifest = json.loads(
        s3.get_object(Bucket=bucket, Key=f"base/{step_name(20)}/manifest.json")["Body"].read()
    )
    assert (manifest["step"], manifest["samples_seen"], manifest["world_size"]) == (20, 320, 2)
    assert (manifest["attempt"], manifest["job_id"], manifest["model"]["d_model"]) == (3, "j-base", 16)
    names = {f["name"] for f in manifest["files"]}
    assert ".metadata" in names and any(n.endswith(".distcp") for n in names)
    for f in manifest["files"]:
        head = s3.head_object(Bucket=bucket, Key=f"base/{step_name(20)}/{f['name']}")
        assert head["ContentLength"] == f["size"]


def test_resume_2_to_1_rank_is_equivalent(s3_server: Any, work: Path, baseline: dict) -> None:
    bucket = baseline["bucket"]
    log = work / "r1.jsonl"
    run = launch(
        work / "r1",
        1,
        tiny_spec(options={"sample_log": str(log)}),  # micro-batches 4 -> 4 accumulation steps
        f"s3://{bucket}/r1",
        env=s3_server.env,
        resume_from=f"s3://{bucket}/base/{step_name(20)}",
    )
    wait_ok(run)
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(21, 41))
    assert_matches(baseline["log"], records, exact=False)
    assert "saved on 2 ranks, loaded on 1" in run.output(0)


def test_resume_2_fsdp_to_4_hsdp_is_equivalent(resumed_on_4_hsdp: dict, baseline: dict) -> None:
    records = resumed_on_4_hsdp["log"]
    assert [r["step"] for r in records] == list(range(21, 41))
    assert {r["world_size"] for r in records} == {4}
    assert_matches(baseline["log"], records, exact=False)


def test_reshard_4_hsdp_to_2_fsdp(
    s3_server: Any, work: Path, baseline: dict, resumed_on_4_hsdp: dict
) -> None:
    bucket = baseline["bucket"]
    log = work / "r4to2.jsonl"
    run = launch(
        work / "r4to2",
        2,
        tiny_spec(options={"sample_log": str(log)}),
        f"s3://{bucket}/r4to2",
        env=s3_server.env,
        resume_from=f"s3://{bucket}/r4/{step_name(30)}",
    )
    wait_ok(run)
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(31, 41))
    assert_matches(baseline["log"], records, exact=False)


def _wait_for_step(run: Any, step: int, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        prog = run.progress()
        if prog and prog.get("step", 0) >= step:
            return prog
        if any(p.poll() is not None for p in run.procs):
            raise AssertionError(f"trainer exited early\n{run.output()}\n{run.stderr()}")
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def test_sigusr1_then_sigterm_checkpoint_exit_75_and_resume(
    work: Path, baseline: dict, tmp_path: Path
) -> None:
    rng = random.Random()
    usr1_at, term_at = rng.randint(2, 5), rng.randint(12, 18)
    ckpt_root = tmp_path / "ckpt"  # local-directory storage this time
    log = tmp_path / "sig.jsonl"
    spec = tiny_spec(step_sleep_s=0.1, options={"sample_log": str(log)})
    run = launch(tmp_path / "a1", 2, spec, str(ckpt_root), attempt=1, grace_s=60)
    _wait_for_step(run, usr1_at)
    run.signal(signal.SIGUSR1)
    _wait_for_step(run, term_at)
    run.signal(signal.SIGTERM)
    wait_ok(run, expect=75, timeout=120)  # 75 = "checkpointed, resume me"
    prog = run.progress()
    stopped = prog["step"]
    assert stopped >= term_at and prog["state"] == "checkpointing"
    assert prog["last_checkpoint_step"] == stopped
    assert prog["last_checkpoint_uri"] == str(ckpt_root / step_name(stopped))
    assert (ckpt_root / step_name(stopped) / "manifest.json").is_file()
    extra = [
        int(p.name.split("-")[1])
        for p in ckpt_root.iterdir()
        if (p / "manifest.json").exists() and int(p.name.split("-")[1]) not in (10, stopped)
    ]
    assert any(usr1_at <= s < stopped for s in extra), f"no SIGUSR1 checkpoint in {extra}"
    # attempt 2 resumes from the latest complete checkpoint under the same root
    run2 = launch(tmp_path / "a2", 2, spec, str(ckpt_root), attempt=2)
    wait_ok(run2)
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, 41)), "a step was lost or repeated"
    assert_matches(baseline["log"], records, exact=True)


def test_half_written_checkpoint_is_ignored(s3_server: Any, work: Path, baseline: dict) -> None:
    """step-30 without a manifest (an upload killed midway) must not be loaded; step-20 is."""
    bucket, s3 = baseline["bucket"], s3_server.client()
    copy_prefix(s3, bucket, f"base/{step_name(20)}", f"half/{step_name(20)}")
    copy_prefix(s3, bucket, f"base/{step_name(30)}", f"half/{step_name(30)}", skip_manifest=True)
    truncate_object(s3, bucket, f"half/{step_name(30)}/__0_0.distcp")
    log = work / "half.jsonl"
    run = launch(
        work / "half",
        1,
        tiny_spec(options={"sample_log": str(log), "stop_at_step": 22}),
        f"s3://{bucket}/half",
        env=s3_server.env,
    )
    wait_ok(run, expect=75)
    records = read_log(log)
    assert [r["step"] for r in records] == [21, 22]
    assert_matches(baseline["log"], records, exact=False)
    assert f"resumed from s3://{bucket}/half/{step_name(20)}" in run.output(0)
    # the abandoned half-written step-30 was cleaned up; the new stop checkpoint is complete
    keys = s3_server.list_keys(bucket, "half/")
    assert not [k for k in keys if step_name(30) in k]
    assert f"half/{step_name(22)}/manifest.json" in keys


def _assert_clean_exit_2(run: Any, *needles: str) -> str:
    codes = run.wait(180)
    err = run.stderr(0)
    assert codes == [2] * len(codes), f"exit codes {codes}\n{run.output()}\n{err}"
    assert "Traceback" not in err, err
    assert "trainer error" in err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("damage", ["truncated-shard", "garbled-metadata", "flipped-byte-shard"])
def test_corrupt_checkpoint_exits_2(s3_server: Any, work: Path, baseline: dict, damage: str) -> None:
    bucket, s3 = baseline["bucket"], s3_server.client()
    prefix = f"corrupt-{damage}"
    copy_prefix(s3, bucket, f"base/{step_name(20)}", f"{prefix}/{step_name(20)}")
    if damage == "truncated-shard":
        truncate_object(s3, bucket, f"{prefix}/{step_name(20)}/__0_0.distcp")
        needle = "corrupt"
    elif damage == "garbled-metadata":  # same size, garbage content: only loading can tell
        key = f"{prefix}/{step_name(20)}/.metadata"
        size = s3.head_object(Bucket=bucket, Key=key)["ContentLength"]
        s3.put_object(Bucket=bucket, Key=key, Body=b"\x00garbage" * (size // 8) + b"!" * (size % 8))
        needle = "could not be loaded"
    else:  # one flipped byte in a shard: only the manifest's digest can tell
        key = f"{prefix}/{step_name(20)}/__0_0.distcp"
        body = bytearray(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        body[len(body) // 2] ^= 0xFF
        s3.put_object(Bucket=bucket, Key=key, Body=bytes(body))
        needle = "__0_0.distcp has xxh3_128"
    run = launch(
        work / prefix, 1, tiny_spec(), f"s3://{bucket}/{prefix}", env=s3_server.env
    )
    _assert_clean_exit_2(run, needle)


def test_wrong_model_exits_2(s3_server: Any, work: Path, baseline: dict) -> None:
    bucket = baseline["bucket"]
    run = launch(
        work / "wrong-model",
        1,
        tiny_spec(model="small"),
        f"s3://{bucket}/wrong-model",
        env=s3_server.env,
        resume_from=f"s3://{bucket}/base/{step_name(20)}",
    )
    _assert_clean_exit_2(run, "different model", "d_model")


def test_store_refusing_connections_exits_81_not_2(tmp_path: Path) -> None:
    """A moto S3 server that answered, then stopped: its port really refuses connections.
    That is an outage (checkpoint_layout/faults.py), not the job's configuration: exit 81
    with one line (the broker waits for the store), never exit 2 (FAILED at once)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    import boto3

    boto3.session.Session().client("s3", endpoint_url=url, region_name="us-east-1",
                                   aws_access_key_id="testing",
                                   aws_secret_access_key="testing").create_bucket(Bucket="cb-outage")
    server.stop()
    run = launch(tmp_path, 1, tiny_spec(), "s3://cb-outage/run", env=env)
    codes = run.wait(120)
    err = run.stderr(0)
    assert codes == [81], f"exit codes {codes}\n{run.output()}\n{err}"
    assert "Traceback" not in err, err
    assert "unreachable" in err and url in err, err


def test_missing_bucket_is_still_exit_2(s3_server: Any, tmp_path: Path) -> None:
    """The job's own spec naming a bucket that does not exist stays a configuration error."""
    run = launch(tmp_path, 1, tiny_spec(), "s3://cb-no-such-bucket-anywhere/ckpt", env=s3_server.env)
    _assert_clean_exit_2(run, "NoSuchBucket", "not usable")


def test_store_refusing_writes_fails_the_run_with_one_line_and_exit_81(
    s3_server: Any, tmp_path: Path
) -> None:
    """Storage that accepts reads but refuses every write (503) after bounded retries:
    the async save of step 2 fails, the training thread learns it at its next save, and
    both ranks exit 81 (a 5xx is a store outage: the broker waits, blaming no node and
    spending no restart) with one line, no traceback, no manifest."""
    from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy

    bucket = s3_server.unique_bucket("refuses-writes")
    with FaultyProxy(s3_server.endpoint_url, FaultPlan(fail_after=0, status=503)) as proxy:
        run = launch(
            tmp_path,
            2,
            tiny_spec(total_steps=4, checkpoint_every=2),
            f"s3://{bucket}/ck",
            env={**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url},
        )
        codes = run.wait(240)
        assert proxy.plan.injected > 0 and proxy.plan.passed == 0
    for rank in (0, 1):
        err = run.stderr(rank)
        assert codes[rank] == 81, f"exit codes {codes}\n{run.output()}\n{err}"
        assert "Traceback" not in err, err
        assert f"checkpoint store s3://{bucket}/ck is unreachable" in err, err
        assert "503" in err or "SlowDown" in err, err
    assert not [k for k in s3_server.list_keys(bucket) if k.endswith("manifest.json")]


def test_bad_config_exits_2(tmp_path: Path) -> None:
    run = launch(tmp_path, 1, '{"total_steps": 5, "model": "gpt-9"}', str(tmp_path / "ck"))
    _assert_clean_exit_2(run, "global_batch_size", "unknown model preset")


def test_missing_resume_checkpoint_exits_77_not_2(tmp_path: Path) -> None:
    """CB_RESUME_FROM pruned or half-written (an older attempt still running): retryable
    exit 77 with one line, not exit 2, which the broker treats as terminal (issue 15)."""
    old = tmp_path / "attempt-1" / step_name(10)
    old.mkdir(parents=True)  # files but no manifest: incomplete
    (old / "__0_0.distcp").write_bytes(b"x")
    run = launch(tmp_path / "run", 1, tiny_spec(), str(tmp_path / "attempt-2"), resume_from=str(old))
    codes = run.wait(180)
    err = run.stderr(0)
    assert codes == [77], f"exit codes {codes}\n{run.output()}\n{err}"
    assert "Traceback" not in err, err
    assert f"CB_RESUME_FROM={old} is not a complete checkpoint" in err, err


def test_bf16_and_activation_checkpointing_run(tmp_path: Path) -> None:
    """The switchable knobs train and checkpoint (loss is not compared: bf16 differs)."""
    log = tmp_path / "bf16.jsonl"
    spec = tiny_spec(
        total_steps=4,
        checkpoint_every=2,
        options={"sample_log": str(log), "mixed_precision": "bf16", "activation_checkpointing": "true"},
    )
    run = launch(tmp_path / "run", 2, spec, str(tmp_path / "ck"))
    wait_ok(run)
    records = read_log(log)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["loss"] > 0 for r in records)
    assert (tmp_path / "ck" / step_name(4) / "manifest.json").is_file()


def test_sigterm_save_past_grace_exits_76_keeps_previous_checkpoint(tmp_path: Path) -> None:
    """CB_GRACE_S is enforced: a step that outlasts the grace leaves no time to save, so
    the trainer exits 76 with one clear line (before the agent's SIGKILL could land
    mid-write) and the last complete checkpoint stays the latest."""
    ckpt_root = tmp_path / "ckpt"
    spec = tiny_spec(total_steps=100, checkpoint_every=3, step_sleep_s=2.0)
    run = launch(tmp_path / "run", 1, spec, str(ckpt_root), grace_s=1.0)
    deadline = time.monotonic() + 180
    while True:  # step 3's checkpoint durable; we are now in step 4's 2 s sleep (or 5's)
        prog = run.progress()
        if prog and (prog.get("last_checkpoint_step") or 0) >= 3:
            break
        if any(p.poll() is not None for p in run.procs) or time.monotonic() > deadline:
            run.kill()
            raise AssertionError(f"no checkpoint at step 3\n{run.output()}\n{run.stderr()}")
        time.sleep(0.05)
    run.signal(signal.SIGTERM)
    codes = run.wait(120)
    err = run.stderr(0)
    assert codes == [76], f"exit codes {codes}\n{run.output()}\n{err}"
    assert "Traceback" not in err, err
    assert "could not complete within CB_GRACE_S=1s" in err, err
    assert "Latest complete checkpoint: step 3" in err, err
    complete = sorted(p.name for p in ckpt_root.iterdir() if (p / "manifest.json").exists())
    assert complete == [step_name(3)]


def _stop_at_step_3(run: Any, ckpt_root: Path, deadline_file: Path, grace_s: float) -> list[int]:
    """Wait for step 3's checkpoint, publish the stop's deadline as the agent does
    (checkpoint_layout/stop_deadline.py), SIGTERM, return the exit codes."""
    limit = time.monotonic() + 180
    while not ((run.progress() or {}).get("last_checkpoint_step") or 0) >= 3:
        if any(p.poll() is not None for p in run.procs) or time.monotonic() > limit:
            run.kill()
            raise AssertionError(f"no checkpoint at step 3\n{run.output()}\n{run.stderr()}")
        time.sleep(0.05)
    write_stop_deadline(deadline_file, StopDeadline(time.time() + grace_s, grace_s))
    run.signal(signal.SIGTERM)
    return run.wait(180)


def test_the_stops_long_grace_overrides_a_short_cb_grace_s(tmp_path: Path) -> None:
    """A drain's long grace is honoured although CB_GRACE_S (fixed at launch) is 1 s: with
    CB_GRACE_S alone this run exits 76 (the test above); with the stop's 600 s the step
    finishes, the emergency checkpoint is saved, exit 75."""
    ckpt_root, dl = tmp_path / "ckpt", tmp_path / "stop-deadline.json"
    spec = tiny_spec(total_steps=100, checkpoint_every=3, step_sleep_s=2.0)
    run = launch(tmp_path / "run", 1, spec, str(ckpt_root), grace_s=1.0,
                 env={"CB_STOP_DEADLINE_FILE": str(dl)})
    codes = _stop_at_step_3(run, ckpt_root, dl, 600.0)
    assert codes == [75], f"exit codes {codes}\n{run.output()}\n{run.stderr(0)}"
    assert "grace 600s from the stop" in run.output(0)
    complete = sorted(p.name for p in ckpt_root.iterdir() if (p / "manifest.json").exists())
    assert len(complete) >= 2 and complete[0] == step_name(3)  # the emergency one is newer


def test_the_stops_short_deadline_overrides_a_long_cb_grace_s(tmp_path: Path) -> None:
    """A stop whose deadline is 1 s away is respected although CB_GRACE_S is 600 s: the
    step in progress outlasts it, so no checkpoint is attempted past it (exit 76, the
    previous complete checkpoint stays the latest), instead of a save the agent's SIGKILL
    would cut."""
    ckpt_root, dl = tmp_path / "ckpt", tmp_path / "stop-deadline.json"
    spec = tiny_spec(total_steps=100, checkpoint_every=3, step_sleep_s=2.0)
    run = launch(tmp_path / "run", 1, spec, str(ckpt_root), grace_s=600.0,
                 env={"CB_STOP_DEADLINE_FILE": str(dl)})
    codes = _stop_at_step_3(run, ckpt_root, dl, 1.0)
    err = run.stderr(0)
    assert codes == [76], f"exit codes {codes}\n{run.output()}\n{err}"
    assert "could not complete within the stop's grace of 1s" in err, err
    complete = sorted(p.name for p in ckpt_root.iterdir() if (p / "manifest.json").exists())
    assert complete == [step_name(3)]
