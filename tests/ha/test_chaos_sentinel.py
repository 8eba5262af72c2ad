"""The campaign's Redis-primary-loss kind, at a small size: the state store survives its host.

Real everything, on loopback: two broker replicas whose store is a redis-server primary
with two replicas and three redis-sentinel processes (the brokers' store URL names the
Sentinels, ``redis+sentinel://``, and follows the primary they elect), two region agents,
trainer ranks, moto's S3 server. Twice during the run the primary is SIGKILLed (its host
lost: no shutdown, no save); the Sentinels promote a replica, the brokers follow it, and
a replacement host joins as a replica of the new primary. Checked as for every campaign:
no job lost, stuck, failed or run twice; never two leaders; every job's per-step samples
and losses equal an uninterrupted run; no INTERNAL and no traceback in any log.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.chaos.campaign import Campaign, Options, TrainerConfig, available_kinds, render
from tests.fixtures.chaos.faults import FaultKind

pytestmark = pytest.mark.slow


def test_kinds_follow_the_store() -> None:
    assert FaultKind.REDIS_PRIMARY_LOSS in available_kinds("redis-sentinel", netns=False)
    assert FaultKind.REDIS_PRIMARY_LOSS not in available_kinds("redis", netns=True)
    assert FaultKind.REDIS_PRIMARY_LOSS not in available_kinds("sqlite", netns=False)
    assert FaultKind.REDIS_RESTART not in available_kinds("redis-sentinel", netns=False)


def test_redis_primary_loss_campaign_loses_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    opts = Options(
        # Seed 29's three jobs are 2-node on-demand jobs; the second region is spot: 4
        # nodes per region let two of them run at once (with 2, one after the other).
        root=tmp_path, seed=29, jobs=3, faults=2, store="redis-sentinel", netns=False,
        regions=2, nodes_per_region=4, kinds=[FaultKind.REDIS_PRIMARY_LOSS],
        forced=[(FaultKind.REDIS_PRIMARY_LOSS, 3.0), (FaultKind.REDIS_PRIMARY_LOSS, 3.0)],
        # test_chaos.py's trainer configurations: the uninterrupted reference runs are
        # shared by the session's campaigns (tests/fixtures/once.py)
        configs=(TrainerConfig(21, 70), TrainerConfig(22, 90)),
        step_sleep_s=0.3, finish_timeout_s=600.0, say=lines.append)
    report = Campaign(opts).run()
    text = render(report) + "\n" + "\n".join(lines)
    losses = [f for f in report["faults"] if f["kind"] == "redis_primary_loss"]
    assert len(losses) == 2, text
    for f in losses:  # a primary really died and another one took over
        d = f["detail"]
        assert d["killed"] != d["promoted"], text
        assert f.get("recovery_s") is not None, text
    assert report["jobs"] == 3, text
    assert not report["lost"], text
    assert not report["stuck"], text
    assert not report["failed"], json.dumps(report["failed"], indent=1) + text
    assert not report["double"], text
    assert not report["two_leaders"], text
    assert not report["wrong"], text
    assert not report["internal"], text
    assert not report["tracebacks"], text
    assert report["double_samples"] > 10 and report["leader_samples"] > 3, text
    assert report["ok"], text
