"""Issue 14 part 3, found by trying the CLI as a new user: durations for plans, merge
semantics for `teams set`, declarative `apply`, jobs newest first, enum names in the SDK.

All against a real broker on loopback (tests/cli/conftest.py), through
brokerctl.main.main as a user's command line would run it."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from brokerctl.common import UsageError, parse_duration, parse_end, parse_time
from brokersdk import CapacityType, MigrationCause, Phase, cause_name
from computebroker.v1 import common_pb2 as pb
from tests.cli.conftest import TEAM, run_cli

run = run_cli  # the one in-process brokerctl runner (tests/cli/conftest.py)


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")


# ---- durations ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("24h", 86400), ("+24h", 86400), ("90m", 5400), ("1d2h", 93600), ("1h30m", 5400),
    ("45s", 45), ("2w", 14 * 86400), ("3600", 3600), ("1.5h", 5400),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["24x", "h", "", "1d-2h", "0h", "tomorrow"])
def test_bad_durations_are_one_clear_error(text: str) -> None:
    with pytest.raises(UsageError, match="bad duration"):
        parse_duration(text)


def test_plan_end_from_duration_end_or_time() -> None:
    assert parse_end(None, "24h", 1000.0) == 1000.0 + 86400
    assert parse_end(None, "1d2h", 0.0) == 93600
    assert parse_end("+2h", None, 1000.0) == 1000.0 + 7200
    assert parse_end(None, "2030-01-01T00:00:00+00:00", 0.0) == parse_time("2030-01-01T00:00:00+00:00")
    assert parse_time("+1d2h", now=0.0) == 93600


def test_plans_create_accepts_a_24h_duration(capsys, broker_address: str) -> None:
    rc, out, err = run(capsys, "--broker", broker_address, "plans", "create", "--name", "dur-24h",
                       "--region", "us-west-2", "--instance-type", "p5.48xlarge", "--count", "1",
                       "--force",
                       "--duration", "24h", "-o", "json")
    assert rc == 0, err
    plan = json.loads(out)
    assert float(plan["end_time"]) - float(plan["start_time"]) == pytest.approx(86400, abs=1)
    rc, out, err = run(capsys, "--broker", broker_address, "plans", "create", "--region", "us-west-2",
                       "--instance-type", "p5.48xlarge", "--count", "1", "--duration", "24x")
    assert rc == 2 and "bad duration '24x'" in err and "Traceback" not in err


# ---- teams set: merge semantics ----------------------------------------------------------

def test_teams_set_changes_only_the_given_flags(capsys, broker_address: str, client) -> None:
    rc, _, err = run(capsys, "--broker", broker_address, "teams", "set", "merge-t", "--cohort", "c1",
                     "--guaranteed", "16", "--borrow-limit", "4", "--strategy", "lend", "--weight", "2")
    assert rc == 0, err
    rc, out, err = run(capsys, "--broker", broker_address, "teams", "set", "merge-t", "--guaranteed", "8")
    assert rc == 0, err
    assert "guaranteed[any] 16 → 8" in out and "cohort" not in out.split("\n")[0], out
    q = client.team("merge-t")
    assert q.cohort == "c1" and q.strategy == 2 and q.fair_share_weight == 2.0
    assert [(e.accelerator, e.guaranteed_gpus, e.borrow_limit_gpus) for e in q.quotas] == [("", 8, 4)]
    # A second accelerator is added beside the first, not instead of it.
    rc, _, err = run(capsys, "--broker", broker_address, "teams", "set", "merge-t", "--guaranteed", "4:h100")
    assert rc == 0, err
    q = client.team("merge-t")
    assert sorted((e.accelerator, e.guaranteed_gpus) for e in q.quotas) == [("", 8), ("h100", 4)]
    assert q.cohort == "c1"
    rc, out, _ = run(capsys, "--broker", broker_address, "teams", "set", "merge-t", "--cohort", "c1")
    assert rc == 0 and "team merge-t: no change" in out


# ---- apply -f ----------------------------------------------------------------------------

FLEET = """
teams:
  fleet-ml:
    cohort: research
    guaranteed: 8
    borrow_limit: 4
  fleet-vision:
    cohort: research
    guaranteed: {h100: 16, any: 4}
    strategy: lend
plans:
  fleet-p5:
    region: us-west-2
    instance_type: p5.48xlarge
    count: 2
    start: "2030-01-01T00:00:00+00:00"
    end: "2030-01-08T00:00:00+00:00"
"""


def test_apply_shows_the_diff_applies_and_is_idempotent(capsys, broker_address: str, client,
                                                        tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet), "--dry-run")
    assert rc == 0, err
    assert "+ team fleet-ml" in out and "+ team fleet-vision" in out and "+ plan fleet-p5" in out
    assert "3 to create, 0 to change, 0 unchanged" in out and "dry run: nothing applied" in out
    assert "fleet-ml" not in {t.team for t in client.teams()}

    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet))
    assert rc == 0 and "applied 3 change(s)" in out, err
    ml = client.team("fleet-ml")
    assert ml.cohort == "research" and [(e.guaranteed_gpus, e.borrow_limit_gpus) for e in ml.quotas] == [(8, 4)]
    vision = client.team("fleet-vision")
    assert sorted((e.accelerator, e.guaranteed_gpus) for e in vision.quotas) == [("", 4), ("h100", 16)]
    assert [p.instance_count for p in client.plans() if p.name == "fleet-p5"] == [2]

    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet))
    assert rc == 0, err
    assert "0 to create, 0 to change, 3 unchanged" in out and "no changes" in out, out
    assert [p.name for p in client.plans()].count("fleet-p5") == 1

    # A change shows old → new; a plan cannot change in place: a conflict, nothing applied.
    fleet.write_text(FLEET.replace("guaranteed: 8", "guaranteed: 12").replace("count: 2", "count: 3"))
    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet))
    assert rc == 2 and "~ team fleet-ml" in out and "guaranteed[any]: 8 → 12" in out
    assert "! plan fleet-p5" in out and "count: 2 → 3" in out and "nothing applied" in err
    assert client.team("fleet-ml").quotas[0].guaranteed_gpus == 8


def test_apply_rejects_bad_files_with_one_line(capsys, broker_address: str, tmp_path: Path) -> None:
    for body, needle in [
        ("teams: {t1: {guaranteed: -1}}", "whole number"),
        ("teams: {t1: {colour: red}}", "unknown field(s) colour"),
        ("nodes: []", "unknown section(s) nodes"),
        ("priority_classes: {urgent: high}", "priority_classes.urgent.value must be a whole number"),
        ("priority_classes: {urgent: {value: 1, colour: red}}", "unknown field(s) colour"),
        ("priority_classes: {urgent: 99999999999}", "priority_classes.urgent.value 99999999999 is out"),
        ("plans: {p: {count: 1}}", "plans.p.region is required"),
        ("teams: [", "not valid YAML"),
    ]:
        f = tmp_path / "bad.yaml"
        f.write_text(textwrap.dedent(body))
        rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(f))
        assert rc == 2 and needle in err, (body, err)
        assert "Traceback" not in out + err


# ---- jobs: newest first, --limit keeps the newest ----------------------------------------

def test_jobs_newest_first_and_limit_keeps_the_newest(capsys, broker_address: str) -> None:
    ids = []
    for i in range(3):
        rc, out, err = run(capsys, "--broker", broker_address, "submit", "--name", f"order-{i}",
                           "--team", TEAM, "--steps", "5", "--label", "suite=order", "-o", "json")
        assert rc == 0, err
        ids.append(json.loads(out)["id"])
    rc, out, _ = run(capsys, "--broker", broker_address, "jobs", "-o", "json")
    listed = [j["id"] for j in json.loads(out) if j["id"] in ids]
    assert listed == ids[::-1]
    rc, out, _ = run(capsys, "--broker", broker_address, "jobs", "-o", "json", "--limit", "2")
    assert [j["id"] for j in json.loads(out)] == ids[::-1][:2]
    rc, out, _ = run(capsys, "--broker", broker_address, "jobs", "--limit", "1")
    assert ids[2] in out and ids[0] not in out
    header = next(line for line in out.splitlines() if "PHASE" in line)
    assert "R/M" in header and "REASON" in header
    rc, _, err = run(capsys, "--broker", broker_address, "jobs", "--limit", "-1")
    assert rc == 2 and "--limit must be >= 0" in err


# ---- SDK: enum names ---------------------------------------------------------------------

def test_sdk_enums_print_as_names() -> None:
    assert str(Phase(pb.JOB_PHASE_SUCCEEDED)) == "succeeded"
    assert f"{Phase(pb.JOB_PHASE_RUNNING):>8}" == " running"
    assert Phase.RUNNING == pb.JOB_PHASE_RUNNING  # still the wire integer
    assert str(CapacityType(pb.CAPACITY_TYPE_TRAINING_PLAN)) == "training-plan"
    assert str(MigrationCause(pb.MIGRATION_CAUSE_SPOT_INTERRUPTION)) == "spot-interruption"
    assert cause_name(pb.Migration(cause_code=pb.MIGRATION_CAUSE_REGION_DRAIN)) == "region-drain"
    assert cause_name(pb.Migration(cause="higher_priority")) == "higher-priority"


def test_handle_phase_is_a_name(client) -> None:
    from brokersdk import JobSpec, TrainerSpec

    handle = client.submit(JobSpec(name="enum-names", team=TEAM, nodes=1, gpus_per_node=1,
                                   trainer=TrainerSpec(total_steps=5)))
    assert handle.phase == "pending"
    assert str(Phase(handle.status().phase)) == "pending"


def test_apply_list_form_and_relative_plan_times_are_idempotent(capsys, broker_address: str,
                                                               tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(textwrap.dedent("""
        teams:
          - name: list-team
            guaranteed: 2
        plans:
          - name: rel-plan
            region: eu-west-1
            accelerator: h100
            count: 1
            start: now
            duration: 2h
    """))
    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet))
    assert rc == 0 and "applied 2 change(s)" in out, err
    rc, out, err = run(capsys, "--broker", broker_address, "apply", "-f", str(fleet))
    assert rc == 0 and "0 to create, 0 to change, 2 unchanged" in out, out + err
