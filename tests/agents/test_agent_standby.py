"""Make-before-break on the agent (docs/contracts.md section 5a), over a real gRPC stream
against the scripted FakeBroker: ``Launch{standby}`` starts the ranks with
``CB_STANDBY_GO_FILE`` and nothing releases them but a ``Go``; a standby is refused beside
a running attempt of the same job (starting it would fence the source)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from computebroker.v1 import agent_pb2
from tests.agents.fake_broker import wait_for
from tests.agents.test_agent_stream import launch_msg

AS = agent_pb2.AttemptState
# A rank that waits for its go file, then records what it was told and exits 0.
WAITER = (
    "import json, os, pathlib, time\n"
    "go = pathlib.Path(os.environ['CB_STANDBY_GO_FILE'])\n"
    "while not go.exists(): time.sleep(0.02)\n"
    "pathlib.Path(os.environ['CB_WORK_DIR'], 'got.json').write_text(go.read_text())\n"
)


def test_standby_waits_for_its_go_then_runs(broker, agent, tmp_path: Path) -> None:
    wait_for(lambda: agent.connected, 30, what="connected")
    msg = launch_msg([sys.executable, "-c", WAITER], job="j-sb")
    msg.standby = True
    assert broker.wait_ack(broker.send(launch=msg)).accepted
    adir = tmp_path / "work" / "jobs" / "j-sb" / "attempt-1"
    wait_for(lambda: any(r.job_id == "j-sb" for hb in broker.of("heartbeat") for r in hb.running), 30,
             what="standby listed as running")
    assert not (adir / "go.json").exists() and not (adir / "got.json").exists()
    assert all(u.state not in (4, 5, 6, 7) for u in broker.updates("j-sb", 1))  # still parked
    go = agent_pb2.Go(job_id="j-sb", attempt=1, resume_from="s3://b/jobs/j-sb/attempt-0/step-000000007",
                      reason="final checkpoint durable")
    assert broker.wait_ack(broker.send(go=go)).accepted
    end = broker.wait_terminal("j-sb", 1)
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end
    got = json.loads((adir / "got.json").read_text())
    assert got == {"action": "go", "resume_from": go.resume_from, "reason": go.reason}
    # a Go for an attempt this agent does not run is refused
    assert not broker.wait_ack(broker.send(go=agent_pb2.Go(job_id="j-sb", attempt=9))).accepted


def test_standby_beside_a_running_attempt_of_the_job_is_refused(broker, agent, fake_trainer) -> None:
    wait_for(lambda: agent.connected, 30, what="connected")
    first = launch_msg(fake_trainer, job="j-2", env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05"})
    assert broker.wait_ack(broker.send(launch=first)).accepted
    sb = launch_msg(fake_trainer, job="j-2", attempt=2)
    sb.standby = True
    ack = broker.wait_ack(broker.send(launch=sb))
    assert not ack.accepted and "another agent" in ack.message
    # the source keeps running: nothing killed it (heartbeats after the refusal list it)
    seen = len(broker.of("heartbeat"))
    hb = wait_for(lambda: len(broker.of("heartbeat")) > seen + 1 and broker.of("heartbeat")[-1], 30,
                  what="two more heartbeats")
    assert any(r.job_id == "j-2" and r.attempt == 1 for r in hb.running)
    assert all(u.state not in (4, 5, 6, 7) for u in broker.updates("j-2", 1))


def test_standby_precopies_the_named_checkpoint_into_its_region_and_reports_it(
        broker, agent, tmp_path: Path) -> None:
    """Launch{standby, precopy_from}: while the ranks start, the agent copies the source's
    last periodic checkpoint into <checkpoint_uri>/step-N of its own store (manifest last)
    and, once the standby is parked too, reports JobUpdate{STARTING, transfer{done}}: the
    broker's cue to stop the source."""
    from tests.agents.test_transfer import make_checkpoint

    src = make_checkpoint(tmp_path / "other-region" / "jobs" / "j-pc" / "attempt-1", 4,
                          checksums="xxh3_128")
    wait_for(lambda: agent.connected, 30, what="connected")
    park = tmp_path / "park-now"
    parker = ("import os, pathlib, time\n"  # parks (progress `standby`) when the test says so
              f"while not pathlib.Path({str(park)!r}).exists(): time.sleep(0.02)\n"
              "pathlib.Path(os.environ['CB_PROGRESS_FILE']).write_text('{\"state\": \"standby\"}')\n"
              + WAITER)
    msg = launch_msg([sys.executable, "-c", parker], job="j-pc", attempt=2)
    msg.standby = True
    msg.checkpoint_uri = str(tmp_path / "ckpt" / "jobs" / "j-pc" / "attempt-2")
    msg.precopy_from = str(src)
    assert broker.wait_ack(broker.send(launch=msg)).accepted

    def reported() -> agent_pb2.JobUpdate | None:
        return next((u for u in broker.updates("j-pc", 2) if u.HasField("transfer")), None)

    copy = Path(msg.checkpoint_uri) / src.name
    wait_for(lambda: (copy / "manifest.json").exists(), 60, what="the pre-copy")
    # not reported while the standby still starts: its start-up must not meet the final save
    assert reported() is None
    park.touch()
    u = wait_for(reported, 60, what="the pre-copy's report")
    assert u.state == AS.ATTEMPT_STATE_STARTING and u.transfer.done and not u.transfer.error
    assert u.transfer.src_uri == str(src) and u.transfer.dst_uri == str(copy)
    assert u.transfer.bytes_done == u.transfer.bytes_total > 0
    assert (copy / "manifest.json").read_bytes() == (src / "manifest.json").read_bytes()
    for f in src.iterdir():
        assert (copy / f.name).read_bytes() == f.read_bytes()
    # still parked: the copy released nothing
    assert not (tmp_path / "work" / "jobs" / "j-pc" / "attempt-2" / "got.json").exists()
    assert broker.wait_ack(broker.send(go=agent_pb2.Go(job_id="j-pc", attempt=2, abort=True))).accepted
