"""End to end: fine-tuning from another job's checkpoint, only with a share. A real broker
over TLS with real user tokens, a root agent running each team as its own uid
(``--job-uid-range``), the built-in trainer's real torch ranks.

Alice's job trains and checkpoints. Bob (same team) cannot start from it until Alice
shares it; then his job resumes from her last checkpoint through a read-only copy and
writes only under its own prefix (hers is untouched). Carol (another team) needs a share
a team admin of Alice's team grants; once revoked, nobody new starts from it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokersdk.errors import NotFound, PermissionDenied
from computebroker.v1 import common_pb2 as pb
from tests.e2e.test_foundation import setup_team, spec, wait_regions
from tests.fixtures.cluster import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def open_cluster() -> Iterator[Cluster]:
    """A cluster under a directory job uids can traverse (tmp_path is root-only)."""
    root = Path(tempfile.mkdtemp(prefix="cb-e2e-share-", dir="/tmp"))
    root.chmod(0o755)
    c = Cluster(root=root)
    try:
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _as(c: Cluster, op, user: str, team: str, role: str = "member"):  # noqa: ANN001, ANN202
    from brokersdk.client import BrokerClient
    from tests.fixtures.pki import session_pki

    secret = op.create_token(user, team, role).secret
    return BrokerClient(c.address, credentials=session_pki().token_credentials(secret))


def _tree(root: Path) -> dict[str, tuple[int, float]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime)
            for p in root.rglob("*") if p.is_file()}


def _lines(client, job_id: str) -> str:  # noqa: ANN001
    return "\n".join(r.line.text for r in client.logs(job_id) if r.WhichOneof("kind") == "line")


def test_fine_tune_from_a_shared_checkpoint(open_cluster: Cluster) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("per-job uids need a root agent: run the tests as root")
    c = open_cluster
    c.start_broker()
    c.start_agent("us-east-2", "--job-uid-range", "61900-61999", nodes=1, gpus=1)
    with c.client() as op:
        setup_team(op)
        setup_team(op, "vision")
        wait_regions(c, op, 1)
        alice, bob = _as(c, op, "alice", "ml"), _as(c, op, "bob", "ml")
        mia, carol = _as(c, op, "mia", "ml", "team-admin"), _as(c, op, "carol", "vision")

        a = alice.submit(spec("pretrain", steps=6, every=3)).wait(timeout=300)
        assert a.phase == pb.JOB_PHASE_SUCCEEDED, f"{a}\n{c.logs()}"
        src = a.progress.last_checkpoint_uri
        assert a.progress.last_checkpoint_step == 6 and f"/jobs/{a.id}/" in src
        a_root = Path(src).parents[1]
        before = _tree(a_root)

        with pytest.raises(PermissionDenied, match="brokerctl share"):
            bob.submit(spec("finetune", steps=9, every=3, resume_from=a.id))

        share = alice.share_checkpoints(a.id)
        b = bob.submit(spec("finetune", steps=9, every=3, resume_from=a.id)).wait(timeout=300)
        assert b.phase == pb.JOB_PHASE_SUCCEEDED, f"{b}\n{c.logs()}"
        assert b.spec.resume_source.share_id == share.id
        text = _lines(bob, b.id)
        assert "resumed from" in text and "(step 6" in text, text[-2000:]
        assert f"jobs/{b.id}/resume-1/step-000000006" in text  # the agent's read-only copy
        # ... removed once b saved its own checkpoint (and its attempt ended)
        assert not (c.root / "agents" / "us-east-2" / "jobs" / b.id / "resume-1").exists()
        assert b.progress.last_checkpoint_step == 9
        assert f"/jobs/{b.id}/" in b.progress.last_checkpoint_uri
        assert _tree(a_root) == before, "the source checkpoints changed"

        # another team: the owner alone cannot give it, a team admin of ml can
        with pytest.raises(PermissionDenied, match="team admin"):
            alice.share_checkpoints(a.id, "vision")
        cross = mia.share_checkpoints(a.id, "vision")
        cj = carol.submit(spec("vision-ft", team="vision", steps=9, every=3,
                               resume_from=a.id)).wait(timeout=300)
        assert cj.phase == pb.JOB_PHASE_SUCCEEDED, f"{cj}\n{c.logs()}"
        assert "(step 6" in _lines(carol, cj.id)
        assert _tree(a_root) == before

        mia.revoke_checkpoint_share(a.id, cross.id)
        with pytest.raises(NotFound, match="does not exist"):  # as if it never existed
            carol.submit(spec("vision-ft2", team="vision", steps=9, every=3, resume_from=a.id))
        for client in (alice, bob, mia, carol):
            client.close()
