"""fencing.py: the attempt-number rules of docs/contracts.md section 6, rule 5 (pure)."""

from region_agents.fencing import AttemptLedger


def test_launch_rules():
    led = AttemptLedger()
    d = led.on_launch("j", 1)
    assert d.accepted and not d.kill_attempt
    led.launched("j", 1)
    dup = led.on_launch("j", 1)
    assert dup.accepted and dup.duplicate  # re-delivered command: ack, do nothing
    newer = led.on_launch("j", 2)
    assert newer.accepted and newer.kill_attempt == 1  # kill the older attempt first
    led.launched("j", 2)
    stale = led.on_launch("j", 1)
    assert not stale.accepted and "stale attempt 1" in stale.message
    led.finished("j", 2)
    again = led.on_launch("j", 2)
    assert not again.accepted and "already ran" in again.message
    assert led.on_launch("j", 3).accepted


def test_stop_rules():
    led = AttemptLedger()
    assert not led.on_stop("j", 1).accepted
    led.launched("j", 2)
    assert led.on_stop("j", 2).accepted
    wrong = led.on_stop("j", 1)
    assert not wrong.accepted and "runs attempt 2" in wrong.message
    led.finished("j", 2)
    assert not led.on_stop("j", 2).accepted
