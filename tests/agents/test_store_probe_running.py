"""The agent re-probes its checkpoint store while it runs (Heartbeat.store_probe): a
moto S3 store stopped after the agent started (its port refuses connections) is
reported failing, with since when, and reported healthy again once it is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from region_agents.agent import AgentConfig, RegionAgent
from tests.agents.conftest import INVENTORY
from tests.agents.fake_broker import FakeBroker, wait_for
from tests.fixtures.stoppable_s3 import StoppableS3


def _probes(fake: FakeBroker) -> list:
    return [h.store_probe for h in fake.of("heartbeat") if h.HasField("store_probe")]


def test_running_probe_reports_an_outage_and_its_end(
        stoppable_s3: StoppableS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in stoppable_s3.env.items():
        monkeypatch.setenv(k, v)
    from region_agents import staging

    monkeypatch.setattr(staging, "_clients", {})
    stoppable_s3.client().create_bucket(Bucket="cb-probe-running")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY.format(bucket="s3://cb-probe-running/ckpt"))
    fake = FakeBroker(heartbeat_interval_s=0.3)
    fake.start()
    agent = RegionAgent(AgentConfig(allow_root_jobs=True, broker_address=fake.address,
                                    inventory_path=str(inv), work_dir=str(tmp_path / "work"),
                                    ranks_per_node=1, store_probe_interval_s=0.5,
                                    store_probe_retry_s=0.5))
    agent.start()
    try:
        reg = wait_for(lambda: fake.of("register"), 30, what="register")[0]
        assert reg.checkpoint_store_error == ""
        wait_for(lambda: any(p.time and not p.error for p in _probes(fake)), 30, what="a healthy probe")
        stoppable_s3.down()
        bad = wait_for(lambda: [p for p in _probes(fake) if p.error], 60, what="a failing probe")[0]
        assert "cb-probe-running" in bad.error and "connect" in bad.error.lower(), bad.error
        assert bad.since > 0
        stoppable_s3.up()
        n = len(_probes(fake))
        wait_for(lambda: any(not p.error for p in _probes(fake)[n:]), 60, what="healthy again")
        assert _probes(fake)[-1].since == 0
    finally:
        agent.stop()
        fake.stop()
