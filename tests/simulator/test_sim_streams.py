"""Each random process of each node has its own stream, keyed by names: a policy's row
is the same run alone, in a batch after other policies, or in another process (another
hash seed), and one process's rate does not move another's draws."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from simulator import run as runner
from simulator.policies import PolicyKind
from simulator.streams import Process, Streams
from tests.simulator.helpers import busy_scenario, random_rows, write_trace

ROOT = Path(__file__).resolve().parents[2]


def _inputs(tmp: Path) -> tuple[Path, Path]:
    trace = write_trace(tmp / "t.csv", random_rows(150))
    scn = tmp / "s.yaml"
    scn.write_text(yaml.safe_dump(busy_scenario()))
    return trace, scn


def _row(out: runner.Outcome, kind: PolicyKind) -> str:
    return json.dumps(out.result["policies"][kind.value], sort_keys=True)


def test_a_row_is_the_same_alone_in_a_batch_and_in_another_process(tmp_path):
    trace, scn = _inputs(tmp_path)
    alone = runner.run(trace, scn, policies=(PolicyKind.OURS,), seed=3)
    batch = runner.run(trace, scn, policies=(PolicyKind.FAILOVER, PolicyKind.NO_MIGRATION, PolicyKind.OURS),
                       seed=3)
    assert _row(alone, PolicyKind.OURS) == _row(batch, PolicyKind.OURS)
    assert _row(batch, PolicyKind.FAILOVER) != _row(batch, PolicyKind.OURS)  # the policies did differ
    code = ("import json,sys; from simulator import run; from simulator.policies import PolicyKind;"
            f"o = run.run({str(trace)!r}, {str(scn)!r}, policies=(PolicyKind.OURS,), seed=3);"
            "sys.stdout.write(json.dumps(o.result['policies']['ours'], sort_keys=True))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # another process, another set order
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True, timeout=300)
    assert child.stdout == _row(alone, PolicyKind.OURS)


def test_another_seed_gives_other_weather(tmp_path):
    trace, scn = _inputs(tmp_path)
    a = runner.run(trace, scn, policies=(PolicyKind.OURS,), seed=3)
    b = runner.run(trace, scn, policies=(PolicyKind.OURS,), seed=4)
    assert _row(a, PolicyKind.OURS) != _row(b, PolicyKind.OURS)


def test_streams_are_keyed_by_names_not_by_draw_order():
    s1, s2 = Streams(1, "scn"), Streams(1, "scn")
    spot_first = [s1.exp_s(Process.SPOT, "n1", 0.2) for _ in range(5)]
    for _ in range(100):  # many node-failure draws (another rate, another order) in between
        s2.exp_s(Process.NODE_FAIL, "n1", 1 / 200)
        s2.exp_s(Process.SPOT, "n2", 0.2)
    assert [s2.exp_s(Process.SPOT, "n1", 0.2) for _ in range(5)] == spot_first
    assert Streams(1, "other").exp_s(Process.SPOT, "n1", 0.2) != spot_first[0]
    assert Streams(2, "scn").exp_s(Process.SPOT, "n1", 0.2) != spot_first[0]
    assert Streams(1, "scn").exp_s(Process.HANG, "n1", 0.0) == float("inf")
