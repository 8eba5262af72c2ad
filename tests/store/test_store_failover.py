"""Store HA (broker/store/redis.py with a ``redis+sentinel://`` URL): real redis-server
primaries and replicas, real redis-sentinel processes, real SIGKILLs.

- A write the replicas did not confirm is UNAVAILABLE, never acknowledged; so is a read
  the broker would acknowledge on.
- The hazard that WAIT closes, shown on the same cluster: a write acknowledged without
  it, while no replica got it, is gone after the failover; with it, it was never
  acknowledged, and the store writes again on the promoted primary.
- A submit + terminal-update burst through a SIGKILL of the primary loses no acknowledged
  write (benchmarks/store_failover.py runs the same repetition many times).
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from broker.store.base import NotFound, StoreUnavailable
from broker.store.redis import RedisStore
from computebroker.v1 import common_pb2 as pb
from tests.fixtures.redis_sentinel import DOWN_AFTER_MS, SentinelCluster, start_sentinel_cluster
from tests.fixtures.redis_server import RedisServer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import store_failover  # noqa: E402

pytestmark = pytest.mark.slow


def _job(job_id: str) -> pb.Job:
    return pb.Job(id=job_id, spec=pb.JobSpec(team="ml", name=job_id))


def test_a_write_no_replica_confirms_is_unavailable_not_acknowledged(
        redis_server: RedisServer) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}"
    store = RedisStore(f"{redis_server.url}?prefix={prefix}&min_replicas=1&replica_wait_ms=100")
    try:
        with pytest.raises(StoreUnavailable, match="state store replica did not confirm"):
            store.create_job(_job("j1"))
        with pytest.raises(StoreUnavailable, match="replica did not confirm"):
            store.acquire_lease_epoch("leader", "me", 5.0)
    finally:
        store.close()
    # Without min_replicas the same server acknowledges (one-server deployments work).
    plain = RedisStore(f"{redis_server.url}?prefix={prefix}")
    try:
        assert plain.create_job(_job("j2")).version == 1
    finally:
        plain.close()


def test_a_read_to_acknowledge_on_is_confirmed_by_a_replica_too(redis_server: RedisServer) -> None:
    """What the broker acknowledges on the strength of a read (an agent's re-sent end found
    already applied, a retried submit's job) must be on a replica: with none to confirm,
    the confirmed read and the barrier are UNAVAILABLE, like a write."""
    prefix = f"c{uuid.uuid4().hex[:8]}"
    plain = RedisStore(f"{redis_server.url}?prefix={prefix}")
    confirming = RedisStore(f"{redis_server.url}?prefix={prefix}&min_replicas=1&replica_wait_ms=100")
    try:
        plain.create_job(_job("j1"))  # on the primary, no replica has it
        assert confirming.get_job("j1").id == "j1"  # a plain read sees it
        with pytest.raises(StoreUnavailable, match="replica did not confirm"):
            confirming.get_job_confirmed("j1")
        with pytest.raises(StoreUnavailable, match="replica did not confirm"):
            confirming.confirm_replicated()
        assert plain.get_job_confirmed("j1").id == "j1"  # nothing to confirm: a plain read
        plain.confirm_replicated()
        with pytest.raises(NotFound):
            plain.get_job_confirmed("nope")
    finally:
        plain.close()
        confirming.close()


def test_failover_loses_what_wait_refused_to_acknowledge(sentinel_cluster: SentinelCluster) -> None:
    c = sentinel_cluster
    prefix = f"h{uuid.uuid4().hex[:8]}"
    waiting = RedisStore(c.url(prefix=prefix, replica_wait_ms=300))
    no_wait = RedisStore(c.url(prefix=prefix, min_replicas=0))
    try:
        waiting.create_job(_job("before"))  # confirmed by a replica
        primary = c.primary_port()
        assert primary is not None
        replicas = [s for p, s in c.servers.items() if p != primary]
        for r in replicas:  # cut the replicas off: they will never see what follows
            r.proc.send_signal(signal.SIGSTOP)
        with redis.Redis(port=primary) as p:
            p.execute_command("CLIENT", "KILL", "TYPE", "replica")
        no_wait.create_job(_job("acked-without-wait"))
        with pytest.raises(StoreUnavailable, match="replica did not confirm"):
            waiting.create_job(_job("refused-by-wait"))
        old = c.kill_primary()
        for r in replicas:
            r.proc.send_signal(signal.SIGCONT)
        c.wait_promoted(old)
        assert waiting.get_job("before").id == "before"
        # The hazard, shown: acknowledged without a replica, lost with the primary.
        with pytest.raises(NotFound):
            no_wait.get_job("acked-without-wait")
        # The refused write may or may not exist; it was never acknowledged. The store
        # writes again, confirmed by the replica the Sentinels re-pointed.
        assert waiting.create_job(_job("after")).version == 1
        assert waiting.get_job("after").id == "after"
    finally:
        waiting.close()
        no_wait.close()


def test_submit_and_terminal_burst_through_primary_sigkill_loses_no_ack(tmp_path: Path) -> None:
    for rep in range(2):
        o = store_failover.run_once(tmp_path / f"rep{rep}")
        assert o.acked_submits > 0 and o.acked_terminal > 0, o
        assert (o.submits_lost, o.terminal_lost) == (0, 0), o
        assert o.writes_resume_s > 0, f"no write acknowledged after the failover: {o}"


def test_cluster_fixture_names_one_primary(tmp_path: Path) -> None:
    c = start_sentinel_cluster(tmp_path / "s", replicas=1)
    try:
        port = c.primary_port()
        assert port in c.servers
        assert c.url(prefix="x").startswith("redis+sentinel://127.0.0.1:")
    finally:
        c.stop()


def _replication_addr(replica_port: int) -> str:
    """The address the primary sees for ``replica_port``'s replication link (the
    replica's ``laddr`` on its master connection), for ``CLIENT KILL ADDR``."""
    with redis.Redis(port=replica_port) as r:
        for cl in r.client_list():
            if "M" in cl.get("flags", ""):
                return str(cl["laddr"])
    raise AssertionError(f"replica {replica_port} has no master link")


def _write_until_acked(store: RedisStore, prefix: str, timeout: float = 30.0) -> str:
    """Create jobs ``prefix-N`` until one is acknowledged; its id (a try that was not
    acknowledged may still exist, so each try is a new job)."""
    deadline = time.monotonic() + timeout
    for n in range(10**6):
        try:
            return store.create_job(_job(f"{prefix}-{n}")).id
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def test_an_ack_is_on_every_replica_the_sentinels_may_promote(
        sentinel_cluster: SentinelCluster) -> None:
    """Two replicas, one lagging (SIGSTOPped, its link cut so nothing reaches it) and
    preferred by the Sentinels (replica-priority 1 against 100). ``WAIT 1`` acknowledges
    a write the other replica confirmed; the primary is SIGKILLed, the lagging replica is
    promoted, and that acknowledged write is gone. The default (``min_replicas=all``)
    does not acknowledge the same write; every write it acknowledged is present after
    the failover, and it writes again on the promoted primary."""
    c = sentinel_cluster
    prefix = f"q{uuid.uuid4().hex[:8]}"
    everyone = RedisStore(c.url(prefix=prefix, replica_wait_ms=300))  # the default: all
    one = RedisStore(c.url(prefix=prefix, min_replicas=1, replica_wait_ms=300))
    acked: list[str] = []
    try:
        primary = c.primary_port()
        assert primary is not None
        preferred, other = sorted(p for p in c.servers if p != primary)
        for port, prio in ((preferred, 1), (other, 100)):
            with redis.Redis(port=port) as r:
                r.config_set("replica-priority", prio)
        everyone.create_job(_job("before"))
        acked.append("before")
        assert everyone.replicas_needed() == 2, "both replicas may be promoted: both confirm"

        link = _replication_addr(preferred)
        stopped = time.monotonic()
        c.servers[preferred].proc.send_signal(signal.SIGSTOP)
        try:
            with redis.Redis(port=primary) as p:  # what follows never reaches it
                p.execute_command("CLIENT", "KILL", "ADDR", link)
            one.create_job(_job("acked-by-one-replica"))  # WAIT 1: the other replica confirmed
            began = time.monotonic() - stopped
            try:
                everyone.create_job(_job("refused-while-one-lags"))
                acked.append("refused-while-one-lags")
            except StoreUnavailable as e:
                assert "1 of 2" in str(e), e
            # Within the Sentinels' down-after the lagging replica may still be promoted:
            # the default must not have acknowledged a write it lacks.
            if began < DOWN_AFTER_MS / 1000 * 0.6:
                assert acked == ["before"], f"acknowledged {began:.2f}s after the SIGSTOP"
            old = c.kill_primary()
        finally:
            c.servers[preferred].proc.send_signal(signal.SIGCONT)
        promoted = c.wait_promoted(old)
        assert promoted == preferred, "the Sentinels promote the replica of priority 1"
        # The hazard, shown: WAIT 1's acknowledged write was on the replica not promoted.
        with pytest.raises(NotFound):
            _until_available(lambda: one.get_job("acked-by-one-replica"))
        for job_id in acked:
            assert _until_available(lambda j=job_id: everyone.get_job(j)).id == job_id
        # The old primary is flagged down, the other replica follows the new primary:
        # one replica to confirm, and writes are acknowledged again.
        after = _write_until_acked(everyone, "after")
        assert everyone.get_job(after).id == after
        assert everyone.replicas_needed() == 1
    finally:
        everyone.close()
        one.close()


def _until_available(read: Callable[[], pb.Job], timeout: float = 30.0) -> pb.Job:
    """``read()`` once the store answers (the promoted primary may still be loading)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
