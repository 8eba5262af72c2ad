"""`brokerctl priority-classes` and `apply -f` with priority_classes:, against a real
broker on loopback (tests/cli/conftest.py), through brokerctl.main.main."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from tests.cli.conftest import run_cli

run = run_cli  # the one in-process brokerctl runner (tests/cli/conftest.py)


@pytest.fixture(autouse=True)
def _width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")


def test_list_set_delete(capsys, broker_address: str, client: BrokerClient) -> None:
    b = ("--broker", broker_address)
    rc, out, err = run(capsys, *b, "priority-classes")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "VALUE", "DEFAULT", "DESCRIPTION"]
    assert [ln.split()[0] for ln in lines[2:]] == ["inference", "experimentation", "training",
                                                   "fine-tuning"]
    assert "training" in next(ln for ln in lines if "yes" in ln)
    assert all(len(ln) <= 100 for ln in lines)

    rc, out, err = run(capsys, *b, "priority-classes", "set", "cli-urgent", "1000",
                       "--description", "on-call fixes that page someone")
    assert rc == 0 and "priority class cli-urgent: created" in out, err
    rc, out, err = run(capsys, *b, "priority-classes", "set", "cli-urgent", "-5",
                       "--description", "on-call fixes that page someone")
    assert rc == 0 and "priority class cli-urgent: value 1000 → -5" in out, out + err
    assert {pc.name: pc.value for pc in client.priority_classes()}["cli-urgent"] == -5
    rc, out, err = run(capsys, *b, "priority-classes", "list", "-o", "json")
    assert rc == 0 and {"name": "cli-urgent", "value": -5,
                        "description": "on-call fixes that page someone"} in json.loads(out)

    rc, out, err = run(capsys, *b, "priority-classes", "set", "bad name", "1")
    assert rc != 0 and "bad name" in err and "Traceback" not in out + err
    rc, out, err = run(capsys, *b, "priority-classes", "delete", "training")
    assert rc != 0 and "default" in err and "Traceback" not in out + err
    rc, out, err = run(capsys, *b, "priority-classes", "delete", "cli-urgent")
    assert rc == 0 and "deleted" in out, err
    assert "cli-urgent" not in {pc.name for pc in client.priority_classes()}


FLEET = """
priority_classes:
  fleet-urgent: {value: 900, description: pager}
  fleet-batch: 5
  training: 70
teams:
  fleet-pc-team:
    guaranteed: 2
"""


def test_apply_priority_classes_diff_dry_run_and_idempotence(capsys, broker_address: str,
                                                            client: BrokerClient, tmp_path: Path) -> None:
    b = ("--broker", broker_address)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(textwrap.dedent(FLEET))
    rc, out, err = run(capsys, *b, "apply", "-f", str(fleet), "--dry-run")
    assert rc == 0, err
    assert "+ priority class fleet-urgent" in out and "value: 900" in out and "description: pager" in out
    assert "+ priority class fleet-batch" in out and "= priority class training" in out
    assert "3 to create, 0 to change, 1 unchanged" in out and "dry run: nothing applied" in out
    assert "fleet-urgent" not in {pc.name for pc in client.priority_classes()}

    rc, out, err = run(capsys, *b, "apply", "-f", str(fleet))
    assert rc == 0 and "applied 3 change(s)" in out, err
    got = {pc.name: (pc.value, pc.description) for pc in client.priority_classes()}
    assert got["fleet-urgent"] == (900, "pager") and got["fleet-batch"] == (5, "")

    rc, out, err = run(capsys, *b, "apply", "-f", str(fleet))
    assert rc == 0 and "0 to create, 0 to change, 4 unchanged" in out and "no changes" in out, out

    # A changed value is an update (~ old → new), shown alone by --dry-run, then applied.
    fleet.write_text(textwrap.dedent(FLEET).replace("fleet-batch: 5", "fleet-batch: 50"))
    rc, out, err = run(capsys, *b, "apply", "-f", str(fleet), "--dry-run")
    assert rc == 0 and "~ priority class fleet-batch" in out and "value: 5 → 50" in out, out
    assert "0 to create, 1 to change, 3 unchanged" in out
    assert {pc.name: pc.value for pc in client.priority_classes()}["fleet-batch"] == 5
    rc, out, err = run(capsys, *b, "apply", "-f", str(fleet))
    assert rc == 0 and "applied 1 change(s)" in out, err
    assert {pc.name: pc.value for pc in client.priority_classes()}["fleet-batch"] == 50
    assert all(len(ln) <= 100 for ln in out.splitlines())
