"""simulator.merge: sections of one run replace another's, only for the same inputs."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.merge import MergeError, merge, same_scenario
from simulator.node_recovery import NodeFailures
from simulator.scenario import _plain, parse
from tests.simulator.helpers import scenario


def _run(policies: dict, **scn) -> dict:  # noqa: ANN003
    return {"trace": {"sha256": "x", "jobs": 3}, "seed": 1, "scenario": parse(scenario(**scn)).to_dict(),
            "policies": policies}


def test_sections_are_replaced_stale_ones_dropped_summaries_current():
    old = _run({"ours": {"jobs": 1, "summary": "old"}, "ours-defrag": {"jobs": 2, "summary": "gone"},
                "static-quota": {"jobs": 3, "summary": "old"}})
    new = _run({"ours": {"jobs": 9, "summary": "new"}})
    out = merge(old, new)
    assert set(out["policies"]) == {"ours", "static-quota"}  # ours-defrag no longer exists
    assert out["policies"]["ours"]["jobs"] == 9 and out["policies"]["static-quota"]["jobs"] == 3
    assert out["policies"]["static-quota"]["summary"] != "old"


def test_other_inputs_are_refused():
    a = _run({"ours": {}})
    with pytest.raises(MergeError, match="seed"):
        merge(a, {**a, "seed": 2})
    with pytest.raises(MergeError, match="scenario"):
        merge(a, _run({}, preempt_budget=3))


def test_a_key_the_older_run_lacked_counts_as_same_only_at_its_default():
    new = _run({})["scenario"]
    old = {k: v for k, v in new.items() if k != "node_failures"}
    assert same_scenario(old, new)
    changed = {**new, "node_failures": _plain(dataclasses.asdict(NodeFailures(spares_per_pool=1)))}
    assert not same_scenario(old, changed)
