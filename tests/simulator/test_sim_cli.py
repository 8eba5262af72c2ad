"""brokerctl sim end to end on a small trace: files written, tables readable, bad input refused."""

from __future__ import annotations

import json

import yaml

from brokerctl.main import main
from tests.simulator.helpers import busy_scenario, random_rows, write_trace


def test_sim_writes_json_markdown_and_plots(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.csv", random_rows(80))
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    out = tmp_path / "out"
    rc = main(["sim", "--trace", str(trace), "--scenario", str(scn), "--out", str(out),
               "--policies", "ours,static-quota", "--limit-jobs", "60", "--seed", "2"])
    assert rc == 0
    res = json.loads((out / "result.json").read_text())
    assert res["trace"]["jobs"] == 60 and res["seed"] == 2
    assert list(res["policies"]) == ["ours", "static-quota"]
    assert res["scenario"]["name"] == "busy"  # the assumptions are echoed
    for png in ("utilisation.png", "jct_cdf.png", "queue.png", "lost_by_cause.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    md = (out / "results.md").read_text()
    assert "| ours |" in md and "| static-quota |" in md
    timing = json.loads((out / "timing.json").read_text())
    assert timing["ours"]["events"] == res["policies"]["ours"]["events"] > 0
    printed = capsys.readouterr().out
    assert "ours" in printed and "result.json" in printed


def test_sim_bad_input_is_a_clear_error(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.csv", random_rows(5))
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    assert main(["sim", "--trace", str(trace), "--scenario", str(scn), "--policies", "best"]) == 2
    assert "unknown policy 'best'" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**busy_scenario(), "regions": [{"name": "x", "pools": [{"kind": "cheap"}]}]}))
    assert main(["sim", "--trace", str(trace), "--scenario", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "kind must be one of on_demand, spot, training_plan" in capsys.readouterr().err
    (tmp_path / "c.csv").write_text("job_id,num_gpus\nx,1\n")
    assert main(["sim", "--trace", str(tmp_path / "c.csv"), "--scenario", str(scn), "--out",
                 str(tmp_path / "o")]) == 2
    assert "lacks column(s) submit_time_s" in capsys.readouterr().err
