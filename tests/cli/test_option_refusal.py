"""A bad trainer option is refused at submit, by a real broker, with one readable line.

SubmitJob runs the one options table (checkpoint_layout/job_options.py): a typo in a
name or a value outside what is allowed is INVALID_ARGUMENT naming the option, the
value and what is allowed, and nothing is stored; `brokerctl submit --trainer-option`
prints that message (exit 2), at 80 columns, in a pipe; a good option is kept.
"""

from __future__ import annotations

import json

import grpc
import pytest

from brokersdk.client import BrokerClient
from brokersdk.errors import InvalidJobSpec
from tests.cli.conftest import TEAM, run_cli


@pytest.mark.parametrize(("option", "words"), [
    ("memory_every=-1", "trainer option memory_every = '-1' is not allowed: an integer from 0"),
    ("memory_every=1e400", "memory_every = '1e400' is not allowed"),
    ("hang_timeout_s=nan", "hang_timeout_s = 'nan' is not allowed: a finite number from 0"),
    ("memory_snapshot_mb=inf", "memory_snapshot_mb = 'inf' is not allowed"),
    ("warm_ranks=maybe", "warm_ranks = 'maybe' is not allowed: true or false"),
    ("memory_evry=1", "trainer option 'memory_evry' is unknown; did you mean 'memory_every'?"),
])
def test_cli_submit_prints_the_refusal(capsys, monkeypatch, broker_address: str, option: str,
                                       words: str) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with BrokerClient(broker_address, timeout=15) as c:
        before = len(list(c.jobs()))
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "opt",
                           "--team", TEAM, "--steps", "5", "--trainer-option", option)
    assert rc == 2, (out, err)
    text = " ".join(err.split())
    assert words in text, err
    assert "spec.trainer.options" in text and "Traceback" not in err
    with BrokerClient(broker_address, timeout=15) as c:
        assert len(list(c.jobs())) == before


def test_grpc_status_and_a_good_option_is_kept(capsys, broker_address: str) -> None:
    with BrokerClient(broker_address, timeout=15) as c:
        with pytest.raises(InvalidJobSpec) as e:
            c.submit({"name": "o", "team": TEAM, "trainer": {"options": {"lr": "nan"}}})
        assert e.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "lr = 'nan' is not allowed: a finite number above 0" in str(e.value)
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "ok",
                           "--team", TEAM, "--steps", "5", "--trainer-option", "memory_every=2",
                           "-o", "json")
    assert rc == 0, err
    assert json.loads(out)["spec"]["trainer"]["options"] == {"memory_every": "2"}
