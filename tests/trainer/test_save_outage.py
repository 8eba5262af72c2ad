"""A store that goes down while the ranks save: training goes on, the save waits.

Real `python -m trainer` ranks (2, gloo) and moto's S3 server behind a proxy whose port
really refuses connections (not a 503) for OUTAGE_S seconds, set off by one request of
a save. Before, a save that failed on an outage ended the attempt at once (exit 81):
the broker relaunched, and ranks, model build and resume were paid again for an outage
of seconds.

Now (trainer/checkpointer.py) a periodic save lost to the outage is dropped and
training goes on (the next periodic save tries again); the final save holds, every rank
waiting with backoff, and is made once the store answers. The ranks agree on every
save's outcome: only rank 0 commits the manifest, so an outage that starts exactly at
the manifest is seen by rank 0 alone. The samples and losses equal an uninterrupted
run's; with no budget (CB_STORE_WAIT_S=0) both ranks still exit 81 with one line each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from checkpoint_layout.manifest import MANIFEST
from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy
from tests.trainer.launch import assert_clean, launch, read_log, reference_run, tiny_spec
from trainer.storage import step_name

pytestmark = pytest.mark.slow

STEPS, EVERY = 24, 4
OUTAGE_S = 12.0


def spec(log: Path) -> dict[str, Any]:
    return tiny_spec(total_steps=STEPS, checkpoint_every=EVERY, step_sleep_s=0.3,
                     options={"sample_log": str(log)})


def put_of(prefix: str, step: int, what: str = "") -> Any:
    """The first PUT of ``prefix``'s step directory (``what``: one file of it)."""
    needle = f"/{prefix}/{step_name(step)}/{what}"
    return lambda method, path: method == "PUT" and needle in path


@pytest.fixture(scope="module")
def reference(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted run on 2 ranks. Without the step sleep (it only paces the
    faulted runs so an outage meets a save; it changes no sample and no loss)."""
    return reference_run(s3_server, tmp_path_factory.mktemp("save-outage"),
                         lambda log: {**spec(log), "step_sleep_s": 0.0}, STEPS)


def assert_same_as_reference(ref: list[dict[str, Any]], log: Path) -> None:
    got = read_log(log)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), [r["step"] for r in got]
    assert [(r["ids"], r["loss"]) for r in got] == [(r["ids"], r["loss"]) for r in ref]


def manifests(s3: Any, bucket: str, prefix: str) -> list[int]:
    """The steps with a committed manifest under ``prefix``."""
    keys = [o["Key"] for o in s3.client().list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/").get("Contents", [])]
    return sorted(int(k.split("/")[1].split("-")[1]) for k in keys if k.endswith(MANIFEST))


def run_with_outage(s3_server: Any, reference: dict[str, Any], name: str,
                    when: Any, wait_s: str = "120") -> tuple[Any, FaultPlan, Path]:
    bucket, work = reference["bucket"], reference["work"]
    log = work / f"{name}.jsonl"
    plan = FaultPlan(outage_when=when, outage_s=OUTAGE_S)
    with FaultyProxy(s3_server.endpoint_url, plan) as proxy:
        run = launch(work / name, 2, spec(log), f"s3://{bucket}/{name}",
                     env={**s3_server.env, "AWS_ENDPOINT_URL": proxy.endpoint_url,
                          "CB_STORE_WAIT_S": wait_s})
        run.codes = run.wait(300)
    assert len(plan.outages) == 1, plan.outages
    down, up = plan.outages[0]
    if wait_s != "0":  # the run outlasted the outage: it waited, it did not give up
        assert up - down >= OUTAGE_S, plan.outages
    return run, plan, log


def test_training_goes_on_through_an_outage_during_a_periodic_save(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """The step-4 save's first shard upload sets off the outage: that save (and any
    other made while the store is down) is dropped, the ranks keep training, a later
    save is durable once the store answers, and the final one too."""
    run, _, log = run_with_outage(s3_server, reference, "periodic", put_of("periodic", 4))
    assert run.codes == [0, 0], f"{run.codes}\n{run.output()}\n{run.stderr(0)}"
    assert_clean(run)
    out = run.output(0)
    assert "checkpoint of step 4 not saved" in out and "training on" in out, out
    assert "checkpoint store answered again after" in out, out
    assert_same_as_reference(reference["log"], log)
    saved = manifests(s3_server, reference["bucket"], "periodic")
    assert 4 not in saved and STEPS in saved, saved
    prog = run.progress()
    assert prog is not None and prog["state"] == "done" and prog["step"] == STEPS
    assert prog["last_checkpoint_step"] == STEPS and not prog.get("store_wait_since"), prog


def test_the_final_save_holds_until_the_store_answers(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """The outage starts at the final save: every rank waits with backoff (progress
    state store_wait meanwhile), then the final checkpoint is made and the run ends 0."""
    run, plan, log = run_with_outage(s3_server, reference, "final", put_of("final", STEPS))
    assert run.codes == [0, 0], f"{run.codes}\n{run.output()}\n{run.stderr(0)}"
    assert_clean(run)
    out = run.output(0)
    assert f"unreachable while saving step {STEPS}" in out, out
    assert "every rank waits" in out and "answered again after" in out, out
    assert_same_as_reference(reference["log"], log)
    assert STEPS in manifests(s3_server, reference["bucket"], "final")


def test_an_outage_only_rank_0_sees_at_the_manifest_is_agreed(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """The outage starts at the step-8 manifest, which rank 0 alone writes (rank 1's part
    was written): the ranks agree the save was lost and both train on; no rank counts
    step 8 durable and the run still ends with the uninterrupted run's results."""
    run, _, log = run_with_outage(s3_server, reference, "commit",
                                  put_of("commit", 8, MANIFEST))
    assert run.codes == [0, 0], f"{run.codes}\n{run.output()}\n{run.stderr(0)}"
    assert_clean(run)
    assert "checkpoint of step 8 not saved" in run.output(0), run.output(0)
    assert_same_as_reference(reference["log"], log)
    saved = manifests(s3_server, reference["bucket"], "commit")
    assert 8 not in saved and 4 in saved and STEPS in saved, saved


def test_no_budget_means_exit_81_on_every_rank(
        s3_server: Any, reference: dict[str, Any]) -> None:
    """CB_STORE_WAIT_S=0: the lost save ends the attempt on both ranks with exit 81 and
    one line each (the broker's wait takes over), no gloo crash on the other rank."""
    run, _, log = run_with_outage(s3_server, reference, "nobudget", put_of("nobudget", 4), "0")
    assert run.codes == [81, 81], f"{run.codes}\n{run.output()}\n{run.stderr(0)}"
    assert_clean(run)
    assert "unreachable" in run.stderr(0) and "unreachable" in run.stderr(1), run.stderr(1)
    assert [r["step"] for r in read_log(log)][-1] < STEPS, "trained on without a budget"
