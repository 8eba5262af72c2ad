"""Checkpoints by owner, at the broker (real TLS broker, real tokens, a fake agent that
records the Launches): a job resumes only from its own checkpoints or from a job that
shared them with its team; a share is the owner's (own team) or a team admin's (another
team), recorded, audited and revocable; no job writes under another job's prefix."""

from __future__ import annotations

import grpc
import pytest

from broker.auth.identity import Role
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import auth_pb2 as aupb
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import jobs_pb2 as jpb
from tests.broker.harness import Broker, FakeAgent, Stubs, spec

BUCKET = "s3://cb-us-east-2"


def _submit(stubs: Stubs, s: pb.JobSpec) -> pb.Job:
    return stubs.jobs.SubmitJob(jpb.SubmitJobRequest(spec=s)).job


def _refused(call, code: grpc.StatusCode, *words: str) -> str:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    for w in words:
        assert w in err.value.details(), err.value.details()
    return err.value.details()


def _finish_with_checkpoint(broker: Broker, agent: FakeAgent, job_id: str) -> str:
    """Run ``job_id``'s first attempt on the fake agent to a durable checkpoint; its URI."""
    launch = agent.wait_launch(job_id, 1)
    uri = f"{launch.checkpoint_uri}/step-000000010"
    agent.update(job_id, 1, apb.ATTEMPT_STATE_RUNNING, step=10, ckpt_step=10, ckpt_uri=uri)
    agent.update(job_id, 1, apb.ATTEMPT_STATE_SUCCEEDED, step=100, ckpt_step=10, ckpt_uri=uri)
    broker.wait_phase(job_id, pb.JOB_PHASE_SUCCEEDED)
    assert broker.get(job_id).progress.last_checkpoint_uri == uri
    return uri


def _share(stubs: Stubs, job_id: str, team: str = "") -> pb.CheckpointShare:
    return stubs.jobs.ShareCheckpoints(jpb.ShareCheckpointsRequest(job_id=job_id, grantee_team=team))


def _revoke(stubs: Stubs, job_id: str, share_id: str) -> pb.CheckpointShare:
    return stubs.jobs.RevokeCheckpointShare(
        jpb.RevokeCheckpointShareRequest(job_id=job_id, share_id=share_id))


def test_same_team_resume_needs_a_share_and_a_revoked_share_refuses_again(
        broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team("ml")
    agent = make_agent(bucket=BUCKET)
    alice, bob = broker.stubs_as("alice"), broker.stubs_as("bob")
    a = _submit(alice, spec("a"))
    uri = _finish_with_checkpoint(broker, agent, a.id)
    assert uri.startswith(f"{BUCKET}/jobs/{a.id}/attempt-1/")

    # same team, no share: refused by job id and by URI, naming the rule and the way out
    for ref in (a.id, uri):
        msg = _refused(lambda r=ref: _submit(bob, spec("b", resume_from=r)),
                       grpc.StatusCode.PERMISSION_DENIED, "not shared", "brokerctl share")
        assert "own checkpoints" in msg
    # nor by writing under A's prefix (the old way to "resume": share its directory)
    _refused(lambda: _submit(bob, spec("b", checkpoint_uri=f"{BUCKET}/jobs/{a.id}")),
             grpc.StatusCode.FAILED_PRECONDITION, "own prefix")
    # bob is not A's owner: he cannot share it for himself
    _refused(lambda: _share(bob, a.id), grpc.StatusCode.PERMISSION_DENIED, "owner")

    share = _share(alice, a.id)
    assert (share.grantee_team, share.granted_by, share.revoked_time) == ("ml", "user:alice", 0)
    assert _share(alice, a.id).id == share.id  # granting twice keeps the one share
    b = _submit(bob, spec("b", resume_from=a.id))
    src = b.spec.resume_source
    assert (src.job_id, src.uri, src.share_id, src.prefix) == (
        a.id, uri, share.id, f"{BUCKET}/jobs/{a.id}")
    launch = agent.wait_launch(b.id, 1)
    assert launch.resume_from == uri                     # reads A's checkpoint ...
    assert launch.checkpoint_uri == f"{BUCKET}/jobs/{b.id}/attempt-1"  # ... writes its own
    by_uri = _submit(bob, spec("b-uri", resume_from=uri))
    assert by_uri.spec.resume_source.job_id == a.id

    # a client cannot forge the broker's record of where it starts from
    forged = spec("forged", resume_source=pb.ResumeSource(job_id=a.id, uri=uri, share_id="x"))
    assert not _submit(bob, forged).spec.HasField("resume_source")

    # revoke: a queued job that has not started from it yet fails at launch; new submits
    # are refused again
    agent.close()
    queued = _submit(bob, spec("queued", resume_from=a.id))
    revoked = _revoke(alice, a.id, share.id)
    assert revoked.revoked_by == "user:alice" and revoked.revoked_time > 0
    _refused(lambda: _submit(bob, spec("c", resume_from=a.id)),
             grpc.StatusCode.PERMISSION_DENIED, "not shared")
    agent.connect()
    failed = broker.wait_phase(queued.id, pb.JOB_PHASE_FAILED)
    ev = [e for e in broker.events(queued.id) if e.to_phase == pb.JOB_PHASE_FAILED][-1]
    assert "revoked by user:alice" in ev.message and ev.reason == "resume_not_shared"
    assert failed.attempt == 0, "it must never have been launched"
    assert not agent.commands("launch", queued.id)

    # the record: the job's events and the audit log name both acts
    types = [e.type for e in broker.events(a.id)]
    assert "checkpoints_shared" in types and "checkpoint_share_revoked" in types
    recs = broker.auth.ListAuditRecords(aupb.ListAuditRecordsRequest(actor="alice")).records
    methods = {r.method.rsplit("/", 1)[-1] for r in recs}
    assert {"ShareCheckpoints", "RevokeCheckpointShare"} <= methods
    shares = broker.get(a.id).checkpoint_shares
    assert len(shares) == 1 and shares[0].revoked_time > 0  # kept, marked revoked


def test_cross_team_share_needs_the_granting_teams_admin(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team("ml")
    broker.team("vision")
    agent = make_agent(bucket=BUCKET)
    alice = broker.stubs_as("alice")
    carol = broker.stubs_as("carol", team="vision")
    vision_admin = broker.stubs_as("vic", Role.TEAM_ADMIN, "vision")
    a = _submit(alice, spec("a"))
    _finish_with_checkpoint(broker, agent, a.id)

    # another team's job, not shared with vision: answered as a job that does not exist
    # (no id of another team is confirmed), by id and by URI
    uri = broker.get(a.id).progress.last_checkpoint_uri
    gone = _refused(lambda: _submit(carol, spec("c", team="vision", resume_from=a.id)),
                    grpc.StatusCode.NOT_FOUND, "does not exist", "ask a team admin")
    assert gone == _refused(lambda: _submit(carol, spec("c", team="vision", resume_from="j-0000")),
                            grpc.StatusCode.NOT_FOUND).replace("j-0000", a.id)
    _refused(lambda: _submit(carol, spec("c", team="vision", resume_from=uri)),
             grpc.StatusCode.FAILED_PRECONDITION, "not inside any job's checkpoints")
    # the owner alone cannot give it to another team; another team's admin cannot take it
    _refused(lambda: _share(alice, a.id, "vision"), grpc.StatusCode.PERMISSION_DENIED,
             "team admin of 'ml'")
    _refused(lambda: _share(vision_admin, a.id, "vision"), grpc.StatusCode.NOT_FOUND)
    _refused(lambda: _share(carol, a.id, "vision"), grpc.StatusCode.NOT_FOUND)
    # a share with ml does not open it to vision
    _share(alice, a.id)
    _refused(lambda: _submit(carol, spec("c", team="vision", resume_from=a.id)),
             grpc.StatusCode.NOT_FOUND, "does not exist")

    ml_admin = broker.stubs_as("mia", Role.TEAM_ADMIN, "ml")
    share = _share(ml_admin, a.id, "vision")
    assert (share.grantee_team, share.granted_by) == ("vision", "user:mia")
    c = _submit(carol, spec("c", team="vision", resume_from=a.id))
    assert c.spec.resume_source.share_id == share.id
    assert agent.wait_launch(c.id, 1).resume_from == broker.get(a.id).progress.last_checkpoint_uri
    # alice (a member) may not end what the admin granted to another team; the admin may
    _refused(lambda: _revoke(alice, a.id, share.id), grpc.StatusCode.PERMISSION_DENIED)
    _revoke(ml_admin, a.id, share.id)
    _refused(lambda: _submit(carol, spec("c2", team="vision", resume_from=a.id)),
             grpc.StatusCode.NOT_FOUND, "does not exist")


def test_prefixes_are_owned_and_resume_points_are_checked(broker: Broker, make_agent) -> None:  # noqa: ANN001
    broker.team("ml")
    make_agent(bucket=BUCKET)
    alice, bob = broker.stubs_as("alice"), broker.stubs_as("bob")
    mine = f"{BUCKET}/teams/ml/alice-run"
    a = _submit(alice, spec("a", checkpoint_uri=mine))
    for other in (mine, f"{mine}/inner", f"{BUCKET}/teams/ml"):  # equal, inside, holding
        _refused(lambda o=other: _submit(bob, spec("b", checkpoint_uri=o)),
                 grpc.StatusCode.FAILED_PRECONDITION, f"checkpoints of job {a.id}")
    assert _submit(bob, spec("b", checkpoint_uri=f"{BUCKET}/teams/ml/bob-run")).id
    for bad, code, word in [
        (f"{mine}/../x/step-000000010", grpc.StatusCode.INVALID_ARGUMENT, ".."),
        (f"{mine}/attempt-1", grpc.StatusCode.INVALID_ARGUMENT, "step directory"),
        (f"{BUCKET}/nobody/step-000000010", grpc.StatusCode.FAILED_PRECONDITION, "not inside any job"),
        ("no-such-job", grpc.StatusCode.NOT_FOUND, "does not exist"),
        (a.id, grpc.StatusCode.FAILED_PRECONDITION, "no durable checkpoint"),
    ]:
        _refused(lambda r=bad: _submit(bob, spec("b", resume_from=r)), code, word)
    # a job's chosen prefix found by URI: still needs the share
    _refused(lambda: _submit(bob, spec("b", resume_from=f"{mine}/attempt-1/step-000000010")),
             grpc.StatusCode.PERMISSION_DENIED, f"job {a.id} are not shared")
