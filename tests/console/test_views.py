"""The console's view models and session rules as data (no browser, no broker)."""

from __future__ import annotations

import time

import pytest

from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from console.fleet import CellState, build_fleet
from console.identity import Identity, Role
from console.jobview import attempts_of, build_job_view, loss_curve
from console.live import sse
from console.plans import Window, build_gantt
from console.queue import build_queues
from console.sessions import SessionsFull, SessionStore

OD, SPOT, PLAN = pb.CAPACITY_TYPE_ON_DEMAND, pb.CAPACITY_TYPE_SPOT, pb.CAPACITY_TYPE_TRAINING_PLAN


def node(i: str, *, region: str = "r1", ctype: int = OD, pool: str = "", us: str = "",
         l3: str = "b1", gpus: int = 8, healthy: bool = True, cordoned: bool = False) -> pb.Node:
    return pb.Node(id=i, region=region, zone=f"{region}a", accelerator="h100", gpus=gpus,
                   capacity_type=ctype, pool=pool, ultraserver_id=us, network_layer_3=l3,
                   healthy=healthy, cordoned=cordoned)


def test_fleet_tree_groups_pools_blocks_and_marks_node_states() -> None:
    usages = [
        cpb.NodeUsage(node=node("a"), allocated_gpus=8, job_ids=["j1"]),
        cpb.NodeUsage(node=node("b"), allocated_gpus=8, borrowed_gpus=4, job_ids=["j2"]),
        cpb.NodeUsage(node=node("c", healthy=False)),
        cpb.NodeUsage(node=node("d", cordoned=True), allocated_gpus=2),
        cpb.NodeUsage(node=node("e", ctype=SPOT, us="us-1"), allocated_gpus=3),
        cpb.NodeUsage(node=node("f", ctype=PLAN, pool="tp-1", l3="b2")),
        cpb.NodeUsage(node=node("g", region="r2")),
    ]
    regions = [cpb.RegionInfo(name="r1", connected=True, draining=True, drain_reason="x")]
    fleet = build_fleet(regions, usages)
    assert [r.name for r in fleet] == ["r1", "r2"]
    r1 = fleet[0]
    assert r1.draining and not fleet[1].connected
    # Paid-for capacity first: training plan, on-demand, spot.
    assert [p.label for p in r1.pools] == ["training-plan · tp-1", "on-demand", "spot"]
    od = r1.pools[1]
    states = {c.id: c.state for b in od.blocks for c in b.nodes}
    assert states == {"a": CellState.FULL, "b": CellState.BORROWED, "c": CellState.UNHEALTHY,
                      "d": CellState.CORDONED}
    spot = r1.pools[2].blocks[0]
    assert (spot.kind, spot.name, spot.nodes[0].state) == ("UltraServer", "us-1",
                                                          CellState.PARTIAL)
    b = next(c for blk in od.blocks for c in blk.nodes if c.id == "b")
    assert b.fill == (50, 50) and "j2" in b.title
    # Free GPUs exclude unhealthy and cordoned nodes.
    assert (od.totals.gpus, od.totals.used, od.totals.borrowed, od.totals.free) == (32, 18, 4, 0)
    assert (r1.totals.unhealthy, r1.totals.cordoned) == (1, 1)


def job(i: str, team: str, phase: int, created: float, **kw: object) -> pb.Job:
    j = pb.Job(id=i, phase=phase, created_time=created,
               spec=pb.JobSpec(name=i, team=team, priority_class="training",
                               resources=pb.Resources(nodes=1, gpus_per_node=8)))
    for k, v in kw.items():
        setattr(j, k, v)
    return j


def test_queue_per_team_pending_oldest_first_with_usage_per_accelerator() -> None:
    teams = [cpb.TeamQuota(team="ml", cohort="c", used_gpus=8, borrowed_gpus=2, lent_gpus=1,
                           quotas=[cpb.QuotaEntry(accelerator="h100", guaranteed_gpus=16,
                                                  borrow_limit_gpus=4)],
                           usage=[cpb.AcceleratorUsage(accelerator="h100", guaranteed_gpus=16,
                                                       used_gpus=8, borrowed_gpus=2, lent_gpus=1,
                                                       pending_gpus=16)])]
    jobs = [job("p2", "ml", pb.JOB_PHASE_PENDING, 3.0, pending_reason="no capacity"),
            job("p1", "ml", pb.JOB_PHASE_PENDING, 2.0, pending_reason="quota"),
            job("r", "ml", pb.JOB_PHASE_RUNNING, 1.0),
            job("done", "ml", pb.JOB_PHASE_SUCCEEDED, 0.5),
            job("o", "other", pb.JOB_PHASE_SUSPENDED, 1.0)]
    queues = build_queues(teams, jobs)
    assert [q.team for q in queues] == ["ml", "other"]
    ml = queues[0]
    assert [(j.id, j.reason) for j in ml.pending] == [("p1", "quota"), ("p2", "no capacity")]
    assert [j.id for j in ml.active] == ["r"]
    line = ml.quotas[0]
    assert (line.accelerator, line.guaranteed, line.used, line.borrowed, line.lent,
            line.pending, line.borrow_limit, line.lend_limit) == (
        "h100", 16, 8, 2, 1, 16, "4", "no limit")
    assert (ml.used, ml.borrowed, ml.lent) == (8, 2, 1)
    assert [j.id for j in queues[1].pending] == ["o"]


def ev(seq: int, t: float, typ: str, attempt: int = 0, region: str = "", to: int = 0,
       **details: str) -> pb.JobEvent:
    return pb.JobEvent(seq=seq, time=t, type=typ, attempt=attempt, region=region, to_phase=to,
                       details=details)


def test_job_timeline_has_a_bar_per_attempt_ticks_moves_and_goodput() -> None:
    j = job("j", "ml", pb.JOB_PHASE_RUNNING, 100.0, attempt=2)
    j.goodput.productive_s, j.goodput.queued_s, j.goodput.lost_migration_s = 60, 20, 20
    m = j.migrations.add(seq=1, cause="region_drain", state="done", from_region="a",
                         to_region="b", from_world_size=2, to_world_size=1, started_time=150,
                         checkpointed_time=152, launched_time=153, running_time=156,
                         first_step_time=157, total_s=7)
    assert m.seq == 1
    events = [
        ev(1, 100, "submitted", to=pb.JOB_PHASE_PENDING),
        ev(2, 110, "launched", 1, "a", pb.JOB_PHASE_LAUNCHING, world_size="2",
           capacity_type=str(SPOT)),
        ev(3, 130, "checkpoint", 1, "a", step="10"),
        ev(4, 140, "progress", 1, "a", step="10", loss="4.0"),
        ev(5, 152, "migrating", 1, "a", pb.JOB_PHASE_MIGRATING),
        ev(6, 153, "launched", 2, "b", pb.JOB_PHASE_LAUNCHING, world_size="1",
           capacity_type=str(OD)),
        ev(7, 170, "progress", 2, "b", step="20", loss="3.0"),
    ]
    j.progress.step, j.progress.loss = 25, 2.5
    view = build_job_view(j, events, ["line"], now=200.0)
    a1, a2 = view.attempts
    assert (a1.number, a1.region, a1.world_size, a1.capacity_type, a1.end, a1.ongoing) == (
        1, "a", 2, "spot", 152, False)
    assert (a2.region, a2.capacity_type, a2.ongoing, a2.end) == ("b", "on-demand", True, 200.0)
    assert a1.bar is not None and a2.bar is not None and a1.bar.left < a2.bar.left
    assert a1.bar.left == 10.0 and round(a1.bar.width, 2) == 42.0
    assert [t.label for t in view.checkpoints] == []  # only checkpoint_durable events tick
    row = view.migrations[0]
    assert row.phases == [("checkpoint", 2), ("queue", 1), ("launch", 3), ("first step", 1)]
    assert [b.kind for b in row.bars] == ["mig-1", "mig-2", "mig-3", "mig-4"]
    assert [round(p.percent) for p in view.goodput] == [60, 20, 0, 0, 20]
    points, (lo, hi), steps = loss_curve(j, events)
    assert (lo, hi, steps) == (2.5, 4.0, (10, 25)) and points.startswith("0.0,0.0")


def test_unfinished_attempt_of_a_finished_job_ends_at_the_next_launch() -> None:
    j = job("j", "ml", pb.JOB_PHASE_SUCCEEDED, 0.0, finished_time=50.0)
    events = [ev(1, 1, "launched", 1, "a", world_size="1"),
              ev(2, 20, "launched", 2, "b", world_size="1"),
              ev(3, 50, "succeeded", 2, "b", pb.JOB_PHASE_SUCCEEDED)]
    a1, a2 = attempts_of(j, events, now=99.0)
    assert (a1.end, a2.end, a1.ongoing, a2.ongoing) == (20, 50, False, False)


def test_a_job_below_its_size_says_so_while_placed_and_not_once_at_full_size() -> None:
    job = pb.Job(id="j", phase=pb.JOB_PHASE_RUNNING, created_time=1000.0)
    job.placement.region, job.placement.ranks = "eu-west-1", 2
    job.placement.nodes.add(node_id="e0", gpus=8)
    rec = job.shrunk
    rec.requested_nodes, rec.running_nodes, rec.since, rec.route = 2, 1, 9_000.0, "elastic_move"
    rec.why = "a move (spot interruption) found room for 1 of 2 nodes in eu-west-1"
    rec.waiting = "waiting for capacity: 1 more node(s) needed in pool h100, 0 free"
    view = build_job_view(job, [], [], now=9_100.0)
    assert view.size == ("running at 2 of 4 ranks since 02:30:00 UTC (a move (spot interruption)"
                         " found room for 1 of 2 nodes in eu-west-1); waiting for capacity: 1 more"
                         " node(s) needed in pool h100, 0 free")
    job.phase = pb.JOB_PHASE_MIGRATING  # not placed: the pending reason speaks instead
    assert build_job_view(job, [], [], now=9_100.0).size == ""
    job.phase = pb.JOB_PHASE_LAUNCHING  # relaunched at full size: the record closes once it runs
    job.placement.nodes.add(node_id="e1", gpus=8)
    assert build_job_view(job, [], [], now=9_100.0).size == ""


def test_gantt_places_plans_per_region_and_tells_reserved_from_backfill() -> None:
    plans = [cpb.TrainingPlan(id="tp-a", region="r1", team="ml", start_time=1000,
                              end_time=2000, instance_count=2, gpus_per_instance=8),
             cpb.TrainingPlan(id="tp-b", region="r0", start_time=1500, end_time=3000)]
    mine = job("mine", "ml", pb.JOB_PHASE_RUNNING, 0)
    theirs = job("theirs", "nlp", pb.JOB_PHASE_RUNNING, 0)
    for j in (mine, theirs):
        j.placement.capacity_type, j.placement.pool = PLAN, "tp-a"
        j.placement.nodes.add(node_id="n", gpus=8)
    g = build_gantt(plans, [mine, theirs, job("od", "ml", pb.JOB_PHASE_RUNNING, 0)], now=1000,
                    window=Window.ALL)
    assert [r.region for r in g.regions] == ["r0", "r1"]
    row = g.regions[1].rows[0]
    # The axis runs from the earliest start to the latest of (last end, now + 1 h) = 4600.
    assert (row.left, round(row.width, 1), row.gpus) == (0.0, 27.8, 16)
    assert [(pj.id, pj.use) for pj in row.jobs] == [("mine", "reserved"), ("theirs", "backfill")]
    assert g.now_pct == 0.0


def test_sse_frames_multiline_html_and_sessions_check_csrf() -> None:
    assert sse("html", "<a>\n<b>") == "event: html\ndata: <a>\ndata: <b>\n\n"
    store = SessionStore(idle_s=60)
    s = store.create("tok", Identity("ann", Role.MEMBER, ("ml",)), client=None)
    assert store.get(s.id) is s and store.get("other") is None
    assert s.csrf_ok(s.csrf) and not s.csrf_ok("") and not s.csrf_ok(s.csrf + "x")
    assert not s.identity.role.can_operate and Role.OPERATOR.can_operate
    store.drop(s.id)
    assert store.get(s.id) is None
    # Bounded per user: a user's new session retires that user's least recently used one.
    small = SessionStore(idle_s=60, max_sessions=3, per_user=2)
    a, b = (small.create("", Identity("u", Role.MEMBER), client=None) for _ in range(2))
    a.last_used = time.time() - 30
    c = small.create("", Identity("u", Role.MEMBER), client=None)
    assert small.get(a.id) is None and small.get(b.id) is b and small.get(c.id) is c
    # Full: another member is refused, nobody is evicted; an operator still gets in.
    v = small.create("", Identity("v", Role.MEMBER), client=None)
    with pytest.raises(SessionsFull):
        small.create("", Identity("w", Role.MEMBER), client=None)
    op = small.create("", Identity("olga", Role.OPERATOR), client=None)
    assert all(small.get(s.id) is s for s in (b, c, v, op))
