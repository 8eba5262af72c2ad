"""The stream budget's bookkeeping as a property: whatever mix of agents, users and
anonymous peers opens and closes streams, no cap is ever exceeded, each refusal names a
cap that really is full, and closing everything leaves no count behind (a leaked count
would shrink a pool for good)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.api.errors import ResourceExhausted
from broker.api.streams import StreamBudget, StreamClaim, StreamLimits, StreamPool

LIMITS = StreamLimits(user_total=12, agent_total=5, public_total=4, per_identity=4, per_team=6,
                      per_peer=8, public_per_peer=2, connections_per_peer=3)

claims = st.builds(
    lambda pool, who, team, host, port: StreamClaim(
        pool, f"peer:ipv4:10.0.0.{host}" if pool is StreamPool.PUBLIC else f"{pool.value}:u{who}",
        team=f"t{team}" if pool is StreamPool.USER else "", peer=f"ipv4:10.0.0.{host}",
        connection=f"ipv4:10.0.0.{host}:{port}"),
    st.sampled_from(list(StreamPool)), st.integers(0, 3), st.integers(0, 2), st.integers(0, 2),
    st.integers(1000, 1004))


def _check_caps(held: list[StreamClaim]) -> None:
    def count(pred) -> int:  # noqa: ANN001
        return sum(1 for c in held if pred(c))

    for pool in StreamPool:
        assert count(lambda c, p=pool: c.pool is p) <= LIMITS.pool_total(pool)
    for c in held:
        if c.pool is not StreamPool.PUBLIC:
            assert count(lambda x, o=c.owner: x.owner == o) <= LIMITS.per_identity
        if c.pool is StreamPool.USER:
            assert count(lambda x, t=c.team: x.pool is StreamPool.USER and x.team == t) <= LIMITS.per_team
        if c.pool is not StreamPool.AGENT:
            mine = [x for x in held if x.pool is not StreamPool.AGENT and x.peer == c.peer]
            assert len(mine) <= LIMITS.per_peer
            assert len({x.connection for x in mine}) <= LIMITS.connections_per_peer
        if c.pool is StreamPool.PUBLIC:
            assert count(lambda x, p=c.peer: x.pool is StreamPool.PUBLIC and x.peer == p) <= \
                LIMITS.public_per_peer


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), claims, st.integers(0, 50)), max_size=80))
def test_caps_hold_and_closing_everything_leaves_nothing(steps) -> None:  # noqa: ANN001
    budget = StreamBudget(LIMITS)
    held: list[StreamClaim] = []
    for opening, claim, pick in steps:
        if opening or not held:
            try:
                budget.acquire(claim, "Watch")
                held.append(claim)
            except ResourceExhausted as e:
                assert "limit" in e.message or "at most" in e.message
                # Refused only when admitting it would really break a cap.
                try:
                    _check_caps([*held, claim])
                except AssertionError:
                    pass
                else:
                    raise AssertionError(f"refused with room left: {e.message}") from None
        else:
            budget.release(held.pop(pick % len(held)))
        _check_caps(held)
        assert budget.open == len(held)
    for c in held:
        budget.release(c)
    assert budget.open == 0
    assert not budget._counts and not budget._per_conn  # noqa: SLF001 - no leaked count
