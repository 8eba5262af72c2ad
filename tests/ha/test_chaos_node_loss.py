"""The campaign's "kill one node's ranks" kind with the memory tier and a spare, at a small
size: a lost node is replaced in place and its job restores from its peers' memory.

Real everything, on loopback (no network namespaces needed): two broker replicas over a
SQLite store, one region agent whose inventory has 3 nodes and reserves 1 spare, trainer
ranks (`python -m trainer`) with the trainer option `memory_every=1`, moto's S3 server.
Seed 29 gives two 2-node jobs (neither elastic nor spot), so one runs at a time beside the
spare. Twice a running job's node is lost: its memory keeper and its ranks SIGKILLed.
Checked as for every campaign (no job lost, stuck, failed or run twice; per-step samples
and losses equal an uninterrupted run; no INTERNAL, no traceback), and the job that lost
a node was replaced in place and restored from memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.chaos.campaign import Campaign, Options, TrainerConfig, available_kinds, render
from tests.fixtures.chaos.faults import FaultKind

pytestmark = pytest.mark.slow


def test_node_loss_kind_is_opt_in() -> None:
    """Default campaigns keep their recorded schedules: the kind is only asked for."""
    assert FaultKind.NODE_RANKS_SIGKILL not in available_kinds("redis", netns=True)
    assert FaultKind.NODE_RANKS_SIGKILL in available_kinds("sqlite", netns=False, opt_in=True)


@pytest.mark.timeout(1200)  # two reference runs and a campaign: slow on a loaded machine
def test_node_loss_campaign_replaces_in_place_and_loses_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    opts = Options(
        root=tmp_path, seed=29, jobs=2, faults=2, store="sqlite", netns=False,
        regions=1, nodes_per_region=3, spares=1, memory_every=1,
        kinds=[FaultKind.NODE_RANKS_SIGKILL],
        forced=[(FaultKind.NODE_RANKS_SIGKILL, 0.0), (FaultKind.NODE_RANKS_SIGKILL, 0.0)],
        # test_chaos.py's trainer configurations: the uninterrupted reference runs are
        # shared by the session's campaigns (tests/fixtures/once.py)
        configs=(TrainerConfig(21, 70), TrainerConfig(22, 90)),
        step_sleep_s=0.3, finish_timeout_s=600.0, say=lines.append)
    report = Campaign(opts).run()
    text = render(report) + "\n" + json.dumps(report["faults"]) + "\n" + "\n".join(lines)
    kills = [f for f in report["faults"] if f["kind"] == "node_ranks_sigkill"
             and f["detail"].get("ranks")]
    assert kills, text
    assert all(f["detail"]["keepers"] >= 1 for f in kills), text  # the node's memory died too
    assert report["node_recoveries"].get("replace_in_place/memory", 0) >= 1, text
    assert report["jobs"] == 2, text
    assert not report["lost"], text
    assert not report["stuck"], text
    assert not report["failed"], json.dumps(report["failed"], indent=1) + text
    assert not report["double"], text
    assert not report["two_leaders"], text
    assert not report["wrong"], text
    assert not report["internal"], text
    assert not report["tracebacks"], text
    assert report["ok"], text
