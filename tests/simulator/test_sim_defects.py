"""Regressions: a numeric team name, an unplaceable job, the summary in a pipe."""

from __future__ import annotations

import json

import yaml

from brokerctl.main import main
from simulator.policies import PolicyKind
from simulator.scenario import load
from tests.simulator.helpers import busy_scenario, jct, random_rows, scenario, simulate, write_trace


def test_an_all_digit_team_name_is_the_trace_team_not_the_default(tmp_path):
    # YAML reads `name: 103959` as an int; the trace's team is the text "103959".
    p = tmp_path / "s.yaml"
    p.write_text("name: n\nregions: [{name: r1, pools: [{kind: on_demand, nodes: 2, price_per_gpu_hour: 1}]}]\n"
                 "teams: [{name: 103959, region: r1, guaranteed_gpus: 16}]\nunknown_team_quota: 8\n")
    scn = load(p)
    assert scn.teams[0].name == "103959" and scn.team("103959").guaranteed_gpus == 16
    # Under static quotas a 16-GPU job runs only if the team's guarantee (16) applies,
    # not the 8-GPU default for an unknown team.
    sim = simulate(tmp_path, yaml.safe_load(p.read_text()), [("big", 0, 1000, 16, "103959")],
                   policy=PolicyKind.STATIC)
    from broker.jobs.lifecycle import SUCCEEDED

    assert not sim.sj["big"].unplaceable and sim.sj["big"].job.phase == SUCCEEDED
    assert 1000 < jct(sim, "big") < 1200
    assert dict(sim.teams[0].guaranteed)[""] == 16


def test_the_committed_scenario_names_every_team_as_text():
    from pathlib import Path

    scn = load(Path(__file__).parents[2] / "simulator" / "scenarios" / "philly_3region.yaml")
    assert all(isinstance(t.name, str) for t in scn.teams)
    assert scn.team("103959").guaranteed_gpus == 24


def test_an_unplaceable_job_is_reported_and_the_others_still_run(tmp_path):
    # Two nodes per layer-3 block: a 4-node gang can never be placed; the small jobs run.
    scn = scenario(regions=[{"name": "r1", "layer3_nodes": 2,
                             "pools": [{"kind": "on_demand", "nodes": 4, "price_per_gpu_hour": 2.0}]}])
    sim = simulate(tmp_path, scn, [("huge", 0, 1000, 32, "t"), ("small", 5, 100, 8, "t")])
    assert "layer-3 block" in sim.sj["huge"].unplaceable and "largest" in sim.sj["huge"].unplaceable
    assert not sim.sj["small"].unplaceable and sim.sj["small"].finish_t > 0
    from simulator import metrics

    m = metrics.collect(sim)
    assert [u["job"] for u in m["unplaceable"]] == ["huge"]
    assert "gang_required: layer_3" in m["unplaceable"][0]["reason"]
    assert m["jct_s"]["n"] == 1  # only the job that ran counts


def test_a_job_over_its_static_quota_is_named_with_that_cause(tmp_path):
    scn = scenario(teams=[{"name": "t", "region": "r1", "guaranteed_gpus": 8}])
    sim = simulate(tmp_path, scn, [("big", 0, 1000, 16, "t"), ("ok", 0, 100, 8, "t")], policy=PolicyKind.STATIC)
    assert "static quota is 8 GPUs" in sim.sj["big"].unplaceable
    assert sim.sj["ok"].finish_t > 0 and not sim.sj["ok"].unplaceable


def test_cli_reports_the_unplaceable_job_and_writes_every_policy(tmp_path, capsys):
    rows = random_rows(40) + [("z-huge", 100, 1000, 128, "a")]
    trace = write_trace(tmp_path / "t.csv", rows)
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    out = tmp_path / "out"
    rc = main(["sim", "--trace", str(trace), "--scenario", str(scn), "--out", str(out),
               "--policies", "ours,skypilot-failover", "--no-plots"])
    assert rc == 0
    res = json.loads((out / "result.json").read_text())
    for name in ("ours", "skypilot-failover"):
        assert [u["job"] for u in res["policies"][name]["unplaceable"]] == ["z-huge"]
        assert res["policies"][name]["jct_s"]["n"] == 40
    printed = capsys.readouterr().out
    assert "job z-huge can never run: needs 16 node(s) of 8 GPUs in one layer-3 block" in printed


def test_summary_is_complete_in_a_pipe(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.csv", random_rows(30))
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    rc = main(["sim", "--trace", str(trace), "--scenario", str(scn), "--out", str(tmp_path / "o"),
               "--policies", "ours-better-capacity,single-region-fifo", "--no-plots"])
    assert rc == 0
    printed = capsys.readouterr().out  # captured: not a terminal, as in a pipe
    assert "…" not in printed
    for word in ("JCT mean", "JCT p99", "wait mean", "wait p99", "preempt max", "util", "goodput",
                 "lost GPU-h", "cost $k", "ours-better-capacity", "single-region-fifo"):
        assert word in printed, word
    table_lines = [ln for ln in printed.splitlines() if "ours-better-capacity" in ln]
    assert table_lines and all(len(ln) <= 80 for ln in table_lines)
