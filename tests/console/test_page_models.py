"""The console's newer view models as data: the job's loss series and move causes, the
jobs list's filters and sort, the plans window, hidden job ids and reclaimed spot nodes."""

from __future__ import annotations

from broker.jobs import loss_series
from brokersdk.enums import SPOT_NOTICE_LABEL
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb
from console.fleet import HIDDEN_JOB, CellState, OwnJobs, build_fleet
from console.joblist import JobQuery, Sort, build_rows, cost_of
from console.jobview import build_job_view, cause_event, goodput_parts, loss_samples
from console.plans import Window, build_gantt, default_window


def test_loss_series_keeps_every_step_then_thins_the_older_half() -> None:
    job = pb.Job()
    loss_series.record(job.loss_series, [(1, 5.0), (2, 4.0), (0, 9.0), (3, 0.0), (4, 3.0)])
    assert [(p.step, p.loss) for p in job.loss_series] == [(1, 5.0), (2, 4.0), (4, 3.0)]
    # A resumed attempt re-runs steps 2..: its points replace the ones it re-runs.
    loss_series.record(job.loss_series, [(2, 3.9), (3, 3.5)])
    assert [p.step for p in job.loss_series] == [1, 2, 3]
    assert job.loss_series[1].loss == 3.9
    # Bounded: the first step and the newest half stay, the older half thins out.
    big = pb.Job()
    loss_series.record(big.loss_series, [(s, 1.0 + 1 / s) for s in range(1, 2001)], cap=100)
    steps = [p.step for p in big.loss_series]
    assert len(steps) <= 100 and steps[0] == 1 and steps[-50:] == list(range(1951, 2001))
    assert steps == sorted(steps)


def test_loss_curve_uses_the_series_and_ignores_jobs_without_loss() -> None:
    job = pb.Job(id="j", phase=pb.JOB_PHASE_RUNNING, created_time=1)
    loss_series.record(job.loss_series, [(s, 10.0 / s) for s in range(1, 101)])
    assert len(loss_samples(job, [])) == 100
    view = build_job_view(job, [], [], now=10)
    assert view.loss_count == 100
    silent = pb.Job(id="k", phase=pb.JOB_PHASE_RUNNING, created_time=1)
    silent.progress.step = 40  # a `-- CMD` job: steps, no loss
    assert build_job_view(silent, [], [], now=10).loss_count == 0


def test_queued_job_counts_its_wait_so_far() -> None:
    job = pb.Job(id="q", phase=pb.JOB_PHASE_PENDING, created_time=100, phase_time=100)
    parts = {p.name: p.seconds for p in goodput_parts(job.goodput, job, now=160)}
    assert parts["queued"] == 60 and parts["productive"] == 0
    running = pb.Job(id="r", phase=pb.JOB_PHASE_RUNNING, phase_time=150)
    running.goodput.queued_s = 20
    parts = {p.name: p.seconds for p in goodput_parts(running.goodput, running, now=160)}
    assert (parts["productive"], parts["queued"]) == (10, 20)


def test_a_move_names_the_event_that_caused_it() -> None:
    def ev(seq: int, t: float, type_: str, attempt: int, msg: str, to: int = 0) -> pb.JobEvent:
        frm = {pb.JOB_PHASE_CHECKPOINTING: pb.JOB_PHASE_RUNNING,
               pb.JOB_PHASE_MIGRATING: pb.JOB_PHASE_CHECKPOINTING}.get(to, 0)
        return pb.JobEvent(seq=seq, time=t, type=type_, attempt=attempt, message=msg,
                           to_phase=to, from_phase=frm)

    events = [ev(1, 10, "launched", 1, "on a"), ev(2, 20, "progress", 1, "step 5"),
              ev(3, 30, "spot_notice", 1, "spot interruption notice for n1: moving",
                 pb.JOB_PHASE_CHECKPOINTING),
              ev(4, 30.5, "checkpoint", 1, "checkpoint at step 6 is durable"),
              ev(6, 31, "migrating", 1, "attempt 1 checkpoint at step 6 saved; moving",
                 pb.JOB_PHASE_MIGRATING),
              ev(5, 40, "launched", 2, "on b")]
    m = pb.Migration(seq=1, cause="spot_interruption", from_attempt=1, started_time=31)
    why = cause_event(m, events)
    assert why is not None and why.seq == 3
    job = pb.Job(id="j", phase=pb.JOB_PHASE_RUNNING, created_time=1, migrations=[m])
    row = build_job_view(job, events, [], now=50).migrations[0]
    assert (row.why_seq, row.why) == (3, "spot interruption notice for n1: moving")


def _job(i: str, team: str, phase: int, created: float, gpus: int = 8,
         price: float = 0.0) -> pb.Job:
    j = pb.Job(id=i, phase=phase, created_time=created,
               spec=pb.JobSpec(name=f"{team}-{i}", team=team,
                               resources=pb.Resources(nodes=1, gpus_per_node=gpus)))
    j.placement.price_per_gpu_hour = price
    if price:
        j.placement.nodes.add(node_id="n", gpus=gpus)
        j.goodput.wall_s, j.goodput.queued_s = 7200 + created, created
    return j


def test_jobs_list_filters_and_sorts() -> None:
    jobs = [_job("a1", "ml", pb.JOB_PHASE_RUNNING, 100, 8, 2.0),
            _job("b2", "vision", pb.JOB_PHASE_PENDING, 300, 16),
            _job("c3", "ml", pb.JOB_PHASE_SUCCEEDED, 200, 2, 1.0)]
    assert cost_of(jobs[0]) == 32.0  # 2 h held x 8 GPUs x 2.0
    newest = build_rows(jobs, JobQuery.parse({}), now=1000)
    assert [r.job.id for r in newest] == ["b2", "c3", "a1"]
    ml = build_rows(jobs, JobQuery.parse({"team": "ml", "sort": "cost"}), now=1000)
    assert [r.job.id for r in ml] == ["a1", "c3"]  # costliest first
    q = JobQuery.parse({"phase": "pending", "q": "VISION"})
    assert [r.job.id for r in build_rows(jobs, q)] == ["b2"]
    by_id = build_rows(jobs, JobQuery.parse({"q": "c3"}))
    assert [r.job.id for r in by_id] == ["c3"]
    asc = JobQuery.parse({"sort": "gpus", "order": "asc"})
    assert [r.gpus for r in build_rows(jobs, asc)] == [2, 8, 16]
    assert asc.link(Sort.GPUS).endswith("order=desc") and "sort=name" in asc.link(Sort.NAME)
    assert JobQuery.parse({"sort": "nonsense"}).sort is Sort.SUBMITTED


def test_plans_window_draws_near_plans_and_summarises_far_ones() -> None:
    day = 86400
    now = 1_800_000_000
    plans = [cpb.TrainingPlan(id="soon", region="r", start_time=now + day, end_time=now + 3 * day),
             cpb.TrainingPlan(id="long", region="r", start_time=now - day, end_time=now + 900 * day),
             cpb.TrainingPlan(id="far", region="r", start_time=now + 4 * 365 * day,
                              end_time=now + 4 * 365 * day + day),
             cpb.TrainingPlan(id="old", region="r", start_time=now - 400 * day,
                              end_time=now - 399 * day)]
    g = build_gantt(plans, [], now=now, window=Window.WEEK)
    rows = {r.plan.id: r for r in g.regions[0].rows}
    assert (g.before, g.after) == (1, 1)
    assert rows["far"].outside == "after" and rows["old"].outside == "before"
    assert rows["soon"].outside == "" and rows["soon"].width > 20  # 2 days of 8: a real bar
    assert rows["long"].clipped_end and not rows["soon"].clipped_end
    assert 10 < g.now_pct < 15 and len(g.ticks) == 7
    assert default_window(plans[:1], now) is Window.WEEK  # "soon" fits a week, not a day
    assert default_window(plans[2:3], now) is Window.YEAR
    assert default_window([], now) is Window.MONTH
    everything = build_gantt(plans, [], now=now, window=Window.ALL)
    assert everything.regions[0].rows[0].width < 1  # why the window exists


def test_fleet_hides_other_teams_job_ids_and_shows_reclaimed_spot_nodes() -> None:
    spot = pb.Node(id="s1", region="r", gpus=8, capacity_type=pb.CAPACITY_TYPE_SPOT,
                   healthy=False, instance_type="p5.48xlarge", price_per_gpu_hour=1.5)
    spot.labels[SPOT_NOTICE_LABEL] = "1800000000"
    sick = pb.Node(id="s2", region="r", gpus=8, capacity_type=pb.CAPACITY_TYPE_SPOT,
                   healthy=False)
    other = pb.Node(id="o1", region="r", gpus=8, capacity_type=pb.CAPACITY_TYPE_ON_DEMAND,
                    healthy=True)
    usages = [cpb.NodeUsage(node=spot, allocated_gpus=8, job_ids=["mine", "theirs"]),
              cpb.NodeUsage(node=sick),
              # the broker leaves other teams' ids out of a member's answer: 6 GPUs used
              # where the viewer's own job holds 2
              cpb.NodeUsage(node=other, allocated_gpus=6, job_ids=["mine"])]
    mine = pb.Job(id="mine")
    mine.placement.nodes.add(node_id="s1", gpus=4)
    mine.placement.nodes.add(node_id="o1", gpus=2)
    fleet = build_fleet([], usages, OwnJobs.of([mine]))
    cells = {c.id: c for p in fleet[0].pools for b in p.blocks for c in b.nodes}
    assert cells["s1"].state is CellState.RECLAIMED and cells["s2"].state is CellState.UNHEALTHY
    assert cells["s1"].jobs == ["mine", HIDDEN_JOB]
    assert cells["o1"].jobs == ["mine", HIDDEN_JOB]
    assert "theirs" not in cells["s1"].title and "p5.48xlarge" in cells["s1"].title
    assert "1.50/GPU-h" in cells["s1"].title
    assert (fleet[0].totals.reclaimed, fleet[0].totals.unhealthy) == (1, 1)
    operator = build_fleet([], usages)  # None: reads every job
    assert next(c for p in operator[0].pools for b in p.blocks for c in b.nodes
                if c.id == "s1").jobs == ["mine", "theirs"]
    alone = pb.Node(id="a1", region="r", gpus=8, healthy=True)
    solo = build_fleet([], [cpb.NodeUsage(node=alone, allocated_gpus=2, job_ids=["mine"])],
                       OwnJobs({"mine"}, {"a1": 2}))
    assert solo[0].pools[0].blocks[0].nodes[0].jobs == ["mine"]  # all GPUs are theirs


def test_list_answers_leave_out_the_loss_series() -> None:
    from broker.api.jobs_service import without_series

    job = pb.Job(id="j")
    loss_series.record(job.loss_series, [(1, 2.0), (2, 1.5)])
    listed = without_series(job)
    assert not listed.loss_series and listed.id == "j"
    assert len(job.loss_series) == 2  # the stored record keeps it
    bare = pb.Job(id="k")
    assert without_series(bare) is bare  # no copy when there is nothing to drop


def test_job_page_renders_for_a_queued_job_and_for_a_job_without_loss() -> None:
    from jinja2 import Environment, FileSystemLoader

    from console.app import HERE
    from console.pages import template_globals

    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=True)
    env.globals.update(template_globals())
    template = env.get_template("job.html")
    queued = pb.Job(id="q", phase=pb.JOB_PHASE_PENDING, created_time=100, phase_time=100,
                    spec=pb.JobSpec(name="q", team="ml"))
    html = template.render(view=build_job_view(queued, [], [], now=160), events=[],
                           layout="fragment.html", identity=None, csrf="")
    assert "not launched yet" in html and "loss 0.0000" not in html and "queued -" not in html
    silent = pb.Job(id="s", phase=pb.JOB_PHASE_RUNNING, created_time=100, attempt=1,
                    spec=pb.JobSpec(name="s", team="ml"))
    silent.progress.step = 30
    events = [pb.JobEvent(seq=i, time=100 + i, type="progress") for i in range(1, 40)]
    html = template.render(view=build_job_view(silent, events, ["[0] hi"], now=160),
                           events=events, layout="fragment.html", identity=None, csrf="")
    assert "this job reports no loss" in html and "loss 0.0000" not in html
    assert html.count('class="ev-progress') == 39  # every event, none cut


def test_job_page_shows_both_restart_budgets_counters() -> None:
    """A job's own failures (restarts) and its nodes' (node failures) spend two budgets
    (broker/jobs/budgets.py): the job page shows each counter once it is not zero."""
    from jinja2 import Environment, FileSystemLoader

    from console.app import HERE
    from console.pages import template_globals

    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=True)
    env.globals.update(template_globals())
    job = pb.Job(id="b", phase=pb.JOB_PHASE_RUNNING, created_time=100, attempt=4, restarts=1,
                 node_failures=2, spec=pb.JobSpec(name="b", team="ml"))
    html = env.get_template("job.html").render(view=build_job_view(job, [], [], now=160),
                                               events=[], layout="fragment.html", identity=None,
                                               csrf="")
    assert "restarts 1" in html and "node failures 2" in html
