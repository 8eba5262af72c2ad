"""`brokerctl share` / `unshare` / `submit --resume-from` against a real broker (TLS,
the operator's token): the share's id and the way to revoke it are printed whole at 80
and 100 columns, `brokerctl job` lists shares, and a refused resume is one error line."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.conftest import CHECKPOINT_ROOTS, TEAM, run_cli

JOB_ID = re.compile(r"submitted job (\S+)")


@pytest.mark.parametrize("width", ["80", "100"])
def test_share_show_unshare(capsys, broker_address: str, monkeypatch: pytest.MonkeyPatch,
                            width: str) -> None:
    monkeypatch.setenv("COLUMNS", width)
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "src",
                           "--team", TEAM, "--steps", "10", "--checkpoint-every", "5")
    assert rc == 0, err
    job_id = JOB_ID.search(out).group(1)  # type: ignore[union-attr]

    rc, out, err = run_cli(capsys, "--broker", broker_address, "share", job_id)
    assert rc == 0, err
    share_id = re.search(r"\((share-[0-9a-f]+),", out).group(1)  # type: ignore[union-attr]
    assert f"checkpoints shared with team {TEAM}" in out
    assert f"brokerctl unshare {job_id} {share_id}" in out.replace("\n", " ")

    rc, out, _ = run_cli(capsys, "--broker", broker_address, "job", job_id)
    assert rc == 0 and "checkpoint shares" in out and share_id in out
    rc, out, _ = run_cli(capsys, "--broker", broker_address, "job", job_id, "-o", "json")
    shares = json.loads(out)["job"]["checkpoint_shares"]
    assert [s["id"] for s in shares] == [share_id]

    # nothing durable to start from yet: one clear error line, exit 2
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "ft",
                           "--team", TEAM, "--resume-from", job_id)
    assert rc == 2 and "no durable checkpoint" in err + out and "Traceback" not in err + out

    rc, out, err = run_cli(capsys, "--broker", broker_address, "unshare", job_id, share_id)
    assert rc == 0, err
    assert f"share {share_id} with team {TEAM}" in out and "revoked" in out
    rc, out, err = run_cli(capsys, "--broker", broker_address, "unshare", job_id, "share-nope")
    assert rc == 2 and "no checkpoint share" in err + out


def test_resubmit_does_not_reuse_the_old_jobs_checkpoint_prefix(capsys, broker_address: str) -> None:
    """A resubmitted job with its own ``checkpoint_uri`` would write under the old job's
    prefix (refused now: a job writes only under its own); resubmit leaves it to the
    region's store and says so."""
    mine = f"{CHECKPOINT_ROOTS[broker_address]}/teams/ml/mine"
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "with-ckpt",
                           "--team", TEAM, "--checkpoint-uri", mine)
    assert rc == 0, err
    old = JOB_ID.search(out).group(1)  # type: ignore[union-attr]
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "again",
                           "--team", TEAM, "--checkpoint-uri", mine)
    assert rc == 2 and f"checkpoints of job {old}" in err + out
    rc, out, err = run_cli(capsys, "--broker", broker_address, "resubmit", old)
    assert rc == 0, err
    assert f"not {mine} (that is {old}'s)" in out.replace("\n", " ")
