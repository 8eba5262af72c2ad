"""CLI output at 100 and 80 columns and in a pipe, compared with golden files
(tests/cli/golden/NAME.txt at 100, NAME_80.txt at 80, NAME_pipe.txt for a pipe: wide, one
line per row, every value whole). A pipe with COLUMNS set wraps cells instead
(test_pipe_with_columns_wraps_and_cuts_nothing).

The outputs are what `brokerctl jobs`, `job ID`, `capacity`, `teams` and `migrations`
print (the same code paths the commands use), for a fixed fleet: a job that moved
after a spot notice from us-west-2 2×8 to eu-west-1 1×8, a pending job with its reason,
a succeeded one. Times are fixed (TZ=UTC, a fixed "now") so the text is stable.

Regenerate after an intended change: ``UPDATE_GOLDEN=1 pytest tests/cli/test_golden.py``,
then review the diff of tests/cli/golden/ like any code change.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from brokerctl import render
from brokerctl.commands_jobs import print_job
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

GOLDEN = Path(__file__).parent / "golden"
NOW = 1795500000.0  # 2026-11-24 04:40:00 UTC
T0 = NOW - 300


@pytest.fixture(autouse=True)
def _utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@dataclass(frozen=True)
class Mode:
    """How stdout looks: a terminal of ``width`` columns, or a pipe (full values)."""

    suffix: str
    width: int
    pipe: bool


# A pipe without COLUMNS is wide (brokerctl.common.PIPE_WIDTH): rows as long as their values.
MODES = [Mode("", 100, False), Mode("_80", 80, False), Mode("_pipe", 1000, True)]
MODE = Mode("", 100, False)  # the mode of the test running now (set by the fixture)


@pytest.fixture(params=MODES, ids=lambda m: m.suffix.lstrip("_") or "100")
def mode(request: pytest.FixtureRequest) -> Iterator[Mode]:
    global MODE
    MODE = request.param
    with render.full_values_mode(MODE.pipe):
        yield MODE
    MODE = Mode("", 100, False)


def printed(fn: Callable[[Console], None]) -> str:
    with open(os.devnull, "w") as sink:
        console = Console(width=MODE.width, record=True, color_system=None, file=sink)
        fn(console)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def check(name: str, text: str) -> None:
    assert all(len(line) <= MODE.width for line in text.splitlines()), text
    if MODE.pipe:
        assert "…" not in text, f"a value was cut in a pipe:\n{text}"
    name += MODE.suffix
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with UPDATE_GOLDEN=1 once and review it"
    assert text == path.read_text(), (
        f"{name} output changed (UPDATE_GOLDEN=1 to accept):\n{text}")


def moved_job() -> pb.Job:
    m = pb.Migration(
        job_id="j-660fe22477cd0590d", job_name="rl-sweep-spot", seq=1, cause="spot_interruption",
        cause_code=pb.MIGRATION_CAUSE_SPOT_INTERRUPTION, state="done",
        state_code=pb.MIGRATION_STATE_DONE, emergency=True, from_region="us-west-2",
        from_world_size=16, from_ranks=2, to_region="eu-west-1", to_world_size=8, to_ranks=1,
        checkpoint_step=19,
        checkpoint_s=0.8, transfer_s=0.01, launch_s=3.2, first_step_s=0.7, total_s=4.2,
        orchestration_s=0.23,
        transfer=pb.TransferStats(bytes_total=360_000, bytes_done=360_000, seconds=0.01,
                                  mb_per_s=36.0, done=True, method="copy"))
    return pb.Job(
        id="j-660fe22477cd0590d", phase=pb.JOB_PHASE_SUCCEEDED, attempt=2, created_time=T0,
        spec=pb.JobSpec(name="rl-sweep-spot", team="research", priority_class="experimentation",
                        resources=pb.Resources(nodes=2, gpus_per_node=8, accelerator="h100"),
                        allowed_regions=["us-west-2", "eu-west-1"],
                        trainer=pb.TrainerSpec(total_steps=30, checkpoint_every=10)),
        placement=pb.Placement(region="eu-west-1", agent_id="eu-west-1-agent",
                               nodes=[pb.NodeAssignment(node_id="euw1-p5-000", gpus=8)],
                               capacity_type=pb.CAPACITY_TYPE_ON_DEMAND, pool="on_demand",
                               world_size=8, ranks=1, price_per_gpu_hour=4.5),
        progress=pb.Progress(step=30, total_steps=30, loss=4.0853, last_checkpoint_step=30,
                             last_checkpoint_uri="s3://cb-demo-eu-west-1/jobs/j-660fe22477cd0590d/"
                                                 "attempt-2/step-000000030"),
        goodput=pb.Goodput(productive_s=60, queued_s=1, lost_preemption_s=4.2, wall_s=66),
        migrations=[m],
    )


def jobs() -> list[pb.Job]:
    pending = pb.Job(
        id="j-660fe22477cd0591a", phase=pb.JOB_PHASE_PENDING, created_time=T0 + 120,
        spec=pb.JobSpec(name="big-pretrain", team="research",
                        resources=pb.Resources(nodes=8, gpus_per_node=8, accelerator="h100"),
                        trainer=pb.TrainerSpec(total_steps=1000)),
        pending_reason="no usable capacity matches 8 node(s), accelerator h100, 8 GPU(s) per node")
    done = pb.Job(
        id="j-660fe22477cd0589f", phase=pb.JOB_PHASE_SUCCEEDED, created_time=T0 - 60, attempt=1,
        spec=pb.JobSpec(name="eval-harness-nightly-full-suite", team="product",
                        resources=pb.Resources(nodes=1, gpus_per_node=2),
                        trainer=pb.TrainerSpec(total_steps=15)),
        placement=pb.Placement(region="us-east-2", world_size=2),
        progress=pb.Progress(step=15, total_steps=15))
    return [done, moved_job(), pending]


def events() -> list[pb.JobEvent]:
    def ev(seq: int, dt: float, type_: str, msg: str, **kw: object) -> pb.JobEvent:
        return pb.JobEvent(job_id="j-660fe22477cd0590d", seq=seq, time=T0 + dt, type=type_,
                           message=msg, **kw)

    return [
        ev(1, 0, "submitted", "submitted by user: 2 node(s) x 8 GPU(s), priority experimentation",
           to_phase=pb.JOB_PHASE_PENDING),
        ev(2, 1, "admitted", "admitted to us-west-2/us-west-2-agent on 2 node(s): 2x8 GPUs in one "
           "block (usw2-spot-000,usw2-spot-001); spot at $1.60/GPU-h", region="us-west-2",
           from_phase=pb.JOB_PHASE_PENDING, to_phase=pb.JOB_PHASE_ADMITTED),
        ev(3, 2, "progress", "step 5/30", region="us-west-2", attempt=1),
        ev(4, 20, "checkpoint", "checkpoint at step 19 is durable: s3://cb-demo-us-west-2/jobs/"
           "j-660fe22477cd0590d/attempt-1/step-000000019", region="us-west-2", attempt=1),
        ev(5, 21, "migrating_out", "spot interruption notice for usw2-spot-000, usw2-spot-001: "
           "emergency checkpoint, then moving", region="us-west-2", attempt=1,
           reason="spot_interruption"),
        ev(6, 26, "migration_completed", "moved us-west-2 -> eu-west-1 (world size 16 -> 8) in "
           "4.2s: checkpoint 0.8s, queue 0.00s, transfer 0.0s, launch 3.2s, first step 0.7s",
           region="eu-west-1", attempt=2),
        ev(7, 66, "succeeded", "attempt 2 finished all steps", region="eu-west-1", attempt=2,
           from_phase=pb.JOB_PHASE_RUNNING, to_phase=pb.JOB_PHASE_SUCCEEDED),
    ]


def test_jobs_golden(mode: Mode) -> None:
    text = printed(lambda c: c.print(render.jobs_view(render.newest_first(jobs()), NOW, width=c.width)))
    ids = [line.split()[0] for line in text.splitlines()[2:] if line.startswith("j-")]
    assert ids[:3] == [
        "j-660fe22477cd0591a", "j-660fe22477cd0590d", "j-660fe22477cd0589f"]  # newest first
    if mode.pipe:  # every value whole (wrapped in its cell): name, team, region, reason
        flat = "".join(text.split())
        for j in jobs():
            for value in (j.id, j.spec.name, j.spec.team, j.placement.region, j.pending_reason):
                assert "".join(value.split()) in flat, (value, text)
    else:
        assert "pending: no usable capacity matches 8 node(s)" in text
    if mode.width == 80:  # no room for REASON: each reason on a line of its own
        assert "REASON" not in text.splitlines()[0]
    check("jobs", text)


def test_job_golden(mode: Mode) -> None:
    text = printed(lambda c: print_job(c, moved_job(), events(), now=NOW))
    if mode.width == 100:
        assert text.splitlines()[0] == ("moved after a spot notice: us-west-2 2 ranks →"
                                        " eu-west-1 1 rank, resumed at step 20, lost 4 s")
    if mode.pipe:  # every event's message whole (paths included), wrapped
        flat = "".join(text.split())
        for e in events():
            if e.type != "progress":
                assert "".join(e.message.split()) in flat, (e.message, text)
    check("job", text)


def test_pipe_with_columns_wraps_and_cuts_nothing() -> None:
    """COLUMNS=80 in a pipe: every row within 80 columns, and still no value cut."""
    global MODE
    MODE = Mode("_fold", 80, True)
    try:
        with render.full_values_mode(True):
            text = printed(lambda c: c.print(render.jobs_view(render.newest_first(jobs()), NOW,
                                                              width=c.width)))
            job = printed(lambda c: print_job(c, moved_job(), events(), now=NOW))
    finally:
        MODE = Mode("", 100, False)
    for out in (text, job):
        assert all(len(line) <= 80 for line in out.splitlines()), out
        assert "…" not in out, out
    assert "GPU(s) per node" in text  # the whole reason, on its own (wrapped) line
    flat = "".join(job.replace("│", "").split())
    assert "s3://cb-demo-eu-west-1/jobs/j-660fe22477cd0590d/attempt-2/step-000000030" in flat


def test_capacity_golden(mode: Mode) -> None:
    rows = [
        cpb.CapacityRow(region="eu-west-1", zone="euw1-az1", capacity_type=pb.CAPACITY_TYPE_ON_DEMAND,
                        pool="on_demand", accelerator="h100", total_gpus=8, allocated_gpus=8,
                        price_per_gpu_hour=4.5),
        cpb.CapacityRow(region="us-west-2", zone="usw2-az2", capacity_type=pb.CAPACITY_TYPE_SPOT,
                        pool="spot", accelerator="h100", total_gpus=16, free_gpus=16,
                        price_per_gpu_hour=1.6),
        cpb.CapacityRow(region="us-west-2", zone="usw2-az2",
                        capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN, pool="tp-7982426f24e7",
                        accelerator="h100", total_gpus=16, allocated_gpus=16, borrowed_gpus=8,
                        unhealthy_gpus=0, price_per_gpu_hour=2.5),
    ]
    text = printed(lambda c: c.print(render.capacity_table(cpb.GetCapacityResponse(rows=rows))))
    header = text.splitlines()[0]
    assert header.split() == ["REGION", "ZONE", "CAPACITY", "ACCEL", "TOTAL", "ALLOC", "FREE",
                              "BORROW", "BAD", "$/GPU-h"]  # no duplicate type/pool columns
    check("capacity", text)


def test_teams_golden(mode: Mode) -> None:
    teams = [
        cpb.TeamQuota(team="research", cohort="ml", strategy=cpb.LENDING_STRATEGY_LEND_AND_BORROW,
                      quotas=[cpb.QuotaEntry(accelerator="h100", guaranteed_gpus=24,
                                             borrow_limit_gpus=16)],
                      used_gpus=32, borrowed_gpus=8, running_jobs=2, pending_jobs=1),
        cpb.TeamQuota(team="product", cohort="ml", strategy=cpb.LENDING_STRATEGY_LEND,
                      quotas=[cpb.QuotaEntry(guaranteed_gpus=16, lend_limit_gpus=8)],
                      used_gpus=2, lent_gpus=8, running_jobs=1),
    ]
    check("teams", printed(lambda c: c.print(render.teams_table(teams))))


def test_migrations_golden(mode: Mode) -> None:
    check("migrations", printed(lambda c: c.print(render.migrations_table(moved_job().migrations))))


def test_event_lines_wrap_only_between_words_at_100_columns() -> None:
    from brokerctl import render_logs

    for e in events():
        text = printed(lambda c, e=e: c.print(render_logs.event_line(e)))
        whole = render_logs.event_line(e).plain.split()
        for line in text.splitlines():
            for token in line.split():
                assert token in whole, (token, text)  # no token was cut in two


def test_live_progress_keeps_the_total_and_world_size_across_a_resume() -> None:
    from brokerctl.live_progress import LiveProgress

    live = LiveProgress(moved_job().__class__(spec=moved_job().spec, attempt=1))
    live.update(pb.JobEvent(type="launched", attempt=1, region="us-west-2",
                            details={"world_size": "16"}))
    assert live.update(pb.JobEvent(type="progress", attempt=1, region="us-west-2",
                                   details={"step": "19", "total_steps": "30", "loss": "4.1"}))
    assert live.text() == "step 19/30 · loss 4.1000 · us-west-2 · world 16 · attempt 1"
    live.update(pb.JobEvent(type="launched", attempt=2, region="eu-west-1",
                            details={"world_size": "8", "resume_from": "s3://b/step-19"}))
    # The first progress of the resumed attempt may omit the total: it stays 30.
    assert live.update(pb.JobEvent(type="progress", attempt=2, region="eu-west-1",
                                   details={"step": "20", "loss": "4.0900"}))
    assert live.text() == "step 20/30 · loss 4.0900 · eu-west-1 · world 8 · attempt 2"


def test_live_progress_refreshes_from_the_job_between_progress_events() -> None:
    from brokerctl.live_progress import LiveProgress

    live = LiveProgress(pb.Job(spec=moved_job().spec, attempt=1))
    live.refresh(moved_job())
    assert live.text() == "step 30/30 · loss 4.0853 · eu-west-1 · 1 rank · attempt 2"
