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


# ---- self-fence (issue 15 gap: cross-host fencing of a partitioned agent) -------------------
def test_self_fence_deadline_is_inside_the_brokers_agent_timeout():
    """The invariant of contracts §9: the agent kills its attempts (F) with time to spare
    before the broker may declare it lost and relaunch (T); a configured value can only
    shorten F, never push it past that."""
    from region_agents.fencing import DEFAULT_AGENT_TIMEOUT_S, self_fence_after

    for t in (6.0, 8.0, 20.0, 60.0):
        f = self_fence_after(t)
        assert 0 < f < t and t - f >= 0.25 * t
        assert self_fence_after(t, configured=10 * t) == f  # cannot be made unsafe
        assert self_fence_after(t, configured=f / 2) == f / 2
    assert self_fence_after(0.0) < DEFAULT_AGENT_TIMEOUT_S  # not told yet: broker default
    from region_agents.fencing import lease_margin

    for t in (6.0, 20.0):  # the ranks' watchdog: after the agent's kill, still inside T
        assert self_fence_after(t) < self_fence_after(t) + lease_margin(t) <= 0.8 * t


def test_broker_contact_counts_from_the_send_time_of_the_answered_message():
    from region_agents.fencing import BrokerContact

    c = BrokerContact(now=100.0)
    assert c.silent_for(105.0) == 5.0
    c.registered(register_sent=102.0)
    c.heartbeat_sent(110.0)
    c.heartbeat_sent(112.0)
    assert c.silent_for(120.0) == 18.0  # nothing answered since the Register
    c.heartbeat_acked()  # answers the heartbeat sent at 110, not "now"
    assert c.silent_for(120.0) == 10.0
    c.new_session()  # the 112 heartbeat's stream is gone: its ack never comes
    c.heartbeat_acked()  # a stray ack with nothing outstanding credits nothing
    assert c.silent_for(120.0) == 10.0
    c.registered(register_sent=105.0)  # older than what we have: no step back
    assert c.silent_for(120.0) == 10.0
