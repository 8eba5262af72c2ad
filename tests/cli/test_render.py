"""Tables render readably at 100 columns: no header is cut or wrapped."""

from __future__ import annotations

import time

from rich.console import Console

from brokerctl import render
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb


def text_of(renderable: object, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def header_ok(out: str, headers: list[str]) -> None:
    header = next(line for line in out.splitlines() if headers[0] in line and headers[-1] in line)
    for h in headers:
        assert h in header, (h, header)
    assert all(len(line) <= 100 for line in out.splitlines())


def job(i: int) -> pb.Job:
    return pb.Job(
        id=f"j-20261122-{i:06d}-abcdef", phase=pb.JOB_PHASE_RUNNING, created_time=time.time() - 90,
        spec=pb.JobSpec(name="very-long-experiment-name-" * 3, team="research-and-development",
                        resources=pb.Resources(nodes=16, gpus_per_node=8),
                        trainer=pb.TrainerSpec(total_steps=100000)),
        placement=pb.Placement(region="ap-southeast-2"),
        progress=pb.Progress(step=12345, total_steps=100000),
    )


def test_jobs_table() -> None:
    out = text_of(render.jobs_table([job(i) for i in range(3)]))
    header_ok(out, ["ID", "NAME", "TEAM", "PHASE", "REGION", "SHAPE", "STEP", "R/M", "AGE", "REASON"])
    assert "12345/100000" in out and "16×8" in out


def test_capacity_tables() -> None:
    row = cpb.CapacityRow(region="ap-southeast-2", zone="apse2-az1", capacity_type=pb.CAPACITY_TYPE_TRAINING_PLAN,
                          pool="tp-0123456789abcdef", accelerator="h100", block="nn-l3-abcdefgh",
                          total_gpus=1024, allocated_gpus=512, free_gpus=512, borrowed_gpus=64,
                          price_per_gpu_hour=2.5)
    resp = cpb.GetCapacityResponse(rows=[row, row])
    header_ok(text_of(render.capacity_table(resp)),
              ["REGION", "ZONE", "CAPACITY", "ACCEL", "TOTAL", "ALLOC", "FREE", "BORROW", "$/GPU-h"])
    header_ok(text_of(render.capacity_table(resp, by_block=True)),
              ["REGION", "ZONE", "CAPACITY", "ACCEL", "BLOCK", "TOTAL", "ALLOC", "FREE", "$/GPU-h"])
    node = cpb.NodeUsage(node=pb.Node(id="use2-p5-000", region="us-east-2", zone="use2-az1",
                                      gpus=8, healthy=True, network_layer_3="nn-l3-a"),
                         allocated_gpus=8, job_ids=["j-1", "j-2"])
    header_ok(text_of(render.nodes_table([node])),
              ["NODE", "REGION", "ZONE", "TYPE", "BLOCK", "GPUS", "USED", "STATE", "JOBS"])


def test_capacity_shows_spares_only_when_a_pool_reserves_them() -> None:
    row = cpb.CapacityRow(region="ap-southeast-2", zone="apse2-az1", capacity_type=pb.CAPACITY_TYPE_ON_DEMAND,
                          pool="on-demand", accelerator="h100", block="nn-l3-abcdefgh",
                          total_gpus=72, allocated_gpus=48, free_gpus=16, spare_gpus=8,
                          price_per_gpu_hour=4.1)
    resp = cpb.GetCapacityResponse(rows=[row, row])
    for width in (80, 100):
        out = text_of(render.capacity_table(resp, by_block=True), width)
        header_ok_at(out, ["REGION", "CAPACITY", "TOTAL", "ALLOC", "FREE", "SPARE", "BORROW"], width)
        total = next(line for line in out.splitlines() if line.lstrip().startswith("total"))
        assert total.split()[1:5] == ["144", "96", "32", "16"], total
    row.spare_gpus = 0
    assert "SPARE" not in text_of(render.capacity_table(cpb.GetCapacityResponse(rows=[row])))
    spare = cpb.NodeUsage(node=pb.Node(id="use2-p5-008", region="us-east-2", gpus=8, healthy=True),
                          spare=True)
    assert "ok,spare" in text_of(render.nodes_table([spare]))


def header_ok_at(out: str, headers: list[str], width: int) -> None:
    header = next(line for line in out.splitlines() if headers[0] in line and headers[-1] in line)
    for h in headers:
        assert h in header, (h, header)
    assert all(len(line) <= width for line in out.splitlines())


def test_operator_tables() -> None:
    region = cpb.RegionInfo(name="us-east-2", agent_ids=["us-east-2-agent"], connected=True,
                            last_heartbeat_time=time.time(), nodes=4, total_gpus=32)
    header_ok(text_of(render.regions_table([region])),
              ["REGION", "AGENTS", "STATUS", "HEARTBEAT", "NODES", "GPUS", "ALLOC", "FREE", "JOBS"])
    team = cpb.TeamQuota(team="research", cohort="ml", quotas=[
        cpb.QuotaEntry(accelerator="h100", guaranteed_gpus=64, borrow_limit_gpus=16)])
    header_ok(text_of(render.teams_table([team])),
              ["TEAM", "COHORT", "STRATEGY", "GUARANTEED", "USED", "BORROW", "LENT", "PEND", "RUN"])
    plan = cpb.TrainingPlan(id="tp-0123456789", name="big-run", region="us-west-2", zone="usw2-az2",
                            instance_type="p5.48xlarge", instance_count=16,
                            start_time=time.time(), end_time=time.time() + 86400,
                            state=cpb.PLAN_STATE_ACTIVE)
    header_ok(text_of(render.plans_table([plan])),
              ["ID", "NAME", "REGION", "INSTANCES", "STATE", "START", "END", "TEAM"])


def test_job_detail_and_events() -> None:
    j = job(1)
    j.pending_reason = "waiting for 16 nodes x 8 GPUs in one layer-3 block"
    j.goodput.wall_s, j.goodput.productive_s = 100.0, 80.0
    events = [pb.JobEvent(job_id=j.id, seq=1, time=time.time(), to_phase=pb.JOB_PHASE_PENDING,
                          type="submitted", actor="user:alice", message="submitted " * 20)]
    j.refusals.add(agent_id="r1-a", region="r1", count=3, message="checkpoint location refused",
                   time=time.time(), until=time.time() + 40)
    out = text_of(render.job_detail(j, events))
    assert "pending" in out and "goodput" in out and "submitted" in out
    assert "r1-a (r1) x3" in out and "checkpoint location refused" in out
    header_ok(out, ["#", "TIME", "EVENT", "MESSAGE"])
    assert "user:alice" in out  # the actor is stacked into the EVENT cell


def test_migrations_table_reads_the_typed_cause_and_state() -> None:
    typed = pb.Migration(job_id="j-1", cause="node_unhealthy", state="transferring",
                         cause_code=pb.MIGRATION_CAUSE_NODE_UNHEALTHY,
                         state_code=pb.MIGRATION_STATE_TRANSFERRING, from_region="a", to_region="b")
    old = pb.Migration(job_id="j-2", cause="spot_interruption", state="queued", emergency=True)
    out = text_of(render.migrations_table([typed, old]))
    assert "unhealthy" in out and "transferring" in out
    assert "spot!" in out and "queued" in out  # a record from an older broker: the strings


def test_steps_of_own_code_count_only_what_the_program_reports() -> None:
    """Found trying examples/task.yaml: a plain script showed `0/100` in `brokerctl jobs`
    (the built-in trainer's default total), though it reports no steps at all."""
    plain = pb.Job(spec=pb.JobSpec(
        command=["python", "hello.py"], trainer=pb.TrainerSpec(total_steps=100)))
    assert render.steps(plain) == "-"
    plain.progress.step = 7
    assert render.steps(plain) == "7"
    plain.progress.total_steps = 60
    assert render.steps(plain) == "7/60"
    builtin = pb.Job(spec=pb.JobSpec(trainer=pb.TrainerSpec(total_steps=40)))
    assert render.steps(builtin) == "0/40"


def test_job_detail_shows_make_before_break_downtime_and_pre_copy() -> None:
    """`brokerctl job` tells a make-before-break move's downtime and its pre-copy (the
    migrations table has no room for them at 100 columns)."""
    j = job(7)
    now = time.time()
    done = j.migrations.add(job_id=j.id, from_region="us-east-2", to_region="eu-west-1",
                            from_world_size=8, to_world_size=8, make_before_break=True,
                            downtime_s=25.88, started_time=now - 300, stop_sent_time=now - 240,
                            precopy_from="s3://a/step-10", precopy_done_time=now - 241)
    done.precopy.CopyFrom(pb.TransferStats(bytes_total=3_050_000_000, seconds=12.5,
                                           method="server-side-copy", done=True))
    held = j.migrations.add(job_id=j.id, make_before_break=True, started_time=now - 5,
                            stop_held_until=now + 595, precopy_from="s3://b/step-20")
    out = text_of(render.job_detail(j, None, now=now))
    assert "move 1: make-before-break, downtime 25.9s" in out
    assert "move 1: pre-copy of the last periodic checkpoint 3,050 MB in 12.5s (server-side-copy)" in out
    assert "move 1: source's Stop held 60.0s for the pre-copy" in out
    assert "move 2: make-before-break, downtime not yet known" in out
    assert "move 2: pre-copy of the last periodic checkpoint copying" in out
    assert "move 2: source's Stop held for the pre-copy, 595 s at most" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    held.precopy.error = "AccessDenied"
    assert "move 2: pre-copy of the last periodic checkpoint failed: AccessDenied" in "\n".join(
        render.move_notes(2, held, now))


def test_a_shrunk_job_says_so_in_job_and_jobs() -> None:
    """A job that shrank in place after a node loss: `brokerctl job`'s `size` line and
    `brokerctl jobs`' reason name the sizes, the lost node and why it has not grown back
    (on a terminal a line below the table, cut at the width)."""
    j = job(1)
    j.placement.nodes.add(node_id="n0", gpus=8)
    j.shrunk.requested_nodes, j.shrunk.running_nodes = 16, 15
    j.shrunk.lost_nodes.append("use2-p5-003")
    j.shrunk.since = 9_000.0
    j.shrunk.waiting = "capacity returned; growing back at 02:47:20 UTC if it stays free"
    want = ("running at 15 of 16 nodes since 02:30:00 UTC (shrunk in place after losing"
            " use2-p5-003); capacity returned; growing back at 02:47:20 UTC if it stays free")
    assert render.shrunk_text(j) == want
    detail = text_of(render.job_detail(j, []))
    flat = " ".join(detail.replace("│", " ").split())
    assert f"size {want}" in flat
    assert all(len(line) <= 100 for line in detail.splitlines())
    with render.full_values_mode(False):  # a terminal: the line below, cut at 100
        listed = text_of(render.jobs_view([j, job(2)]))
    assert f"{j.id} running: running at 15 of 16 nodes since 02:30:00 UTC (shrunk in place" in listed
    assert job(2).id in listed and render.shrunk_text(job(2)) == ""


def test_a_job_an_elastic_move_left_small_says_so_in_ranks() -> None:
    """A move placed a 2-node job of 2 ranks per node on one node: the reported ranks
    (2) against the requested size in ranks (4), and the move that made it small."""
    j = job(1)
    j.placement.nodes.add(node_id="e0", gpus=8)
    j.placement.ranks = 2
    rec = j.shrunk
    rec.requested_nodes, rec.running_nodes, rec.since, rec.route = 2, 1, 9_000.0, "elastic_move"
    rec.why = "a move (spot interruption) found room for 1 of 2 nodes in eu-west-1"
    rec.waiting = "waiting for capacity: 1 more node(s) needed in pool p, 0 free"
    assert render.shrunk_text(j) == (
        "running at 2 of 4 ranks since 02:30:00 UTC (a move (spot interruption) found room for 1"
        " of 2 nodes in eu-west-1); waiting for capacity: 1 more node(s) needed in pool p, 0 free")
