"""The outcome order the ranks agree on (trainer/agree.py) and the resume's wait budget
(trainer/outage_wait.py), as plain functions; the multi-rank behaviour is tested with
real ranks in test_resume_outage.py."""

from __future__ import annotations

import errno

import pytest

from trainer.agree import Outcome, agree, outcome_of
from trainer.errors import PeerCrashed, ResumeUnavailable, StoreUnavailable, TrainerError
from trainer.outage_wait import MAX_DELAY_S, OutageWait


def test_outcomes_are_ordered_by_what_must_win() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert outcome_of(None) is Outcome.OK
    assert outcome_of(StoreUnavailable("down")) is Outcome.OUTAGE
    assert outcome_of(refused) is Outcome.OUTAGE  # a raw store error the table calls one
    assert outcome_of(ResumeUnavailable("gone")) is Outcome.RESUME_UNAVAILABLE
    assert outcome_of(TrainerError("corrupt")) is Outcome.CONFIG
    assert outcome_of(KeyError("bug")) is Outcome.CRASH
    assert Outcome.OK < Outcome.OUTAGE < Outcome.RESUME_UNAVAILABLE < Outcome.CONFIG < Outcome.CRASH


def test_one_rank_raises_what_it_caught() -> None:
    agree(None)  # nothing failed: returns
    with pytest.raises(TrainerError, match="corrupt"):
        agree(TrainerError("corrupt"))
    with pytest.raises(StoreUnavailable, match="checkpoint store unreachable"):
        agree(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"))
    with pytest.raises(KeyError):
        agree(KeyError("bug"))
    assert issubclass(PeerCrashed, RuntimeError)


def test_wait_budget_backs_off_and_ends() -> None:
    w = OutageWait(budget_s=40.0, since=1000.0)
    assert not w.give_up(1000.0) and w.give_up(1040.0)
    delays = []
    for _ in range(6):
        delays.append(w.next_delay(1000.0))
        w.tries += 1
    assert delays == [min(d, MAX_DELAY_S) for d in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)]
    assert MAX_DELAY_S <= 2.0  # the store back is noticed within 2 s
    assert w.next_delay(1039.5) == 0.5  # never past the budget
    assert OutageWait(budget_s=0.0).give_up()  # no budget: exit at once
