"""Budget of long-lived streams (WatchJob, StreamJobLogs, agent Connect, workdir
transfers, health Watch): pools, and caps per identity, team, peer address and
connection.

Why: the gRPC server is synchronous, one thread per running RPC. Before issue 12 every
stream held a thread of the one shared pool, so 270 idle WatchJob or Connect streams
starved every other RPC. Streams are admitted only while the budget holds (beyond it:
RESOURCE_EXHAUSTED with a message that says which cap and what to do), and the server's
pool is sized :meth:`StreamLimits.threads` (broker/server.py), so unary RPCs (reads,
submits) always find one of their ``max_workers`` threads.

Why pools: with one shared budget, whoever fills it locks everyone else out. Four
anonymous peers holding 130 health ``Watch`` streams each, or four members holding 128
``WatchJob`` each, took all 512 slots; agents could then not ``Connect`` and nobody
could watch a job. So each kind of caller draws from its own pool
(:class:`StreamPool`): agents' streams never compete with users', and streams opened
before any credential (the public health ``Watch``) have a small pool of their own with
a small cap per peer address. Within the user pool a team and a peer address may hold
only part of it, so one team's members (or one host) cannot take it all.

The decision is data: :meth:`StreamBudget.refusal` walks :data:`CAPS` (which cap, what
it counts) in order and returns the first one a new stream would exceed.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from broker.api.errors import ResourceExhausted
from broker.api.peer_gate import real_peer

if TYPE_CHECKING:
    from broker.config import BrokerConfig


class StreamPool(enum.Enum):
    """Which budget a stream draws from, decided by who opened it."""

    AGENT = "agent"  # a region agent's certificate: Connect, workdir fetches
    USER = "user"  # any authenticated user (token or user certificate)
    PUBLIC = "public"  # no credential at all: health Watch (before any credential is seen)


@dataclass(frozen=True)
class StreamLimits:
    """Every stream cap, from the broker's config (broker/config.py says what each is)."""

    user_total: int = 512
    agent_total: int = 256
    public_total: int = 32
    per_identity: int = 128
    per_team: int = 256
    per_peer: int = 256
    public_per_peer: int = 8
    connections_per_peer: int = 64

    @classmethod
    def from_config(cls, c: BrokerConfig) -> StreamLimits:
        return cls(user_total=c.max_streams, agent_total=c.max_agent_streams,
                   public_total=c.max_public_streams, per_identity=c.max_streams_per_identity,
                   per_team=c.max_streams_per_team, per_peer=c.max_streams_per_peer,
                   public_per_peer=c.max_public_streams_per_peer,
                   connections_per_peer=c.max_connections_per_peer)

    def pool_total(self, pool: StreamPool) -> int:
        return {StreamPool.AGENT: self.agent_total, StreamPool.USER: self.user_total,
                StreamPool.PUBLIC: self.public_total}[pool]

    def threads(self) -> int:
        """Server threads streams may hold at once (every pool full)."""
        return self.user_total + self.agent_total + self.public_total


@dataclass(frozen=True)
class StreamClaim:
    """Who a new stream counts against. ``peer``: the caller's host ("" when the call
    came over the API workers' private link, where the worker already applied the
    per-address caps); ``connection``: host and port (one TCP connection)."""

    pool: StreamPool
    owner: str
    team: str = ""
    peer: str = ""
    connection: str = ""


def _peer_host(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``; ``ipv6:[::1]:5678`` -> ``ipv6:[::1]``."""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def stream_claim(context: grpc.ServicerContext, *, peer_known: bool = True) -> StreamClaim:
    """The one seam for who a stream counts against.

    The authenticated principal (broker/auth/interceptor.py wraps the context before the
    edge sees it); without one (a public method such as health Watch), the caller's peer
    host, port stripped, so one client's connections count together. Never a header: a
    header names whoever the caller claims to be.
    """
    principal = getattr(context, "principal", None)
    name = getattr(principal, "name", "")
    raw_peer = real_peer(context.peer() or "unknown") if peer_known else ""
    host = _peer_host(raw_peer) if raw_peer else ""
    if name:
        role = getattr(getattr(principal, "role", None), "value", "")
        pool = StreamPool.AGENT if role == "agent" else StreamPool.USER
        return StreamClaim(pool, f"{role}:{name}" if role else name,
                           team=getattr(principal, "team", "") or "", peer=host, connection=raw_peer)
    return StreamClaim(StreamPool.PUBLIC, f"peer:{host or 'unknown'}", peer=host, connection=raw_peer)


def stream_owner(context: grpc.ServicerContext) -> str:
    """The identity a stream counts against (see :func:`stream_claim`)."""
    return stream_claim(context).owner


@dataclass(frozen=True)
class Cap:
    """One cap: which claims it applies to, the counter key it reads, its limit, and
    the refusal text (``{method}``, ``{n}``, ``{limit}``, ``{key}`` are filled in)."""

    name: str
    applies: Callable[[StreamClaim], bool]
    key: Callable[[StreamClaim], str]
    limit: Callable[[StreamLimits, StreamClaim], int]
    message: str


def _not_agent(c: StreamClaim) -> bool:
    return c.pool is not StreamPool.AGENT


# The caps, checked in this order; the first exceeded one refuses the stream. Agents are
# exempt from the per-address caps: they were named by the CA at the TLS handshake and
# draw from their own pool.
CAPS: tuple[Cap, ...] = (
    Cap("pool", lambda c: True, lambda c: f"pool:{c.pool.value}",
        lambda lim, c: lim.pool_total(c.pool),
        "{method}: the broker serves at most {limit} open {pool} streams and all are in use;"
        " retry later (an operator can raise {setting})"),
    Cap("connections_per_peer", lambda c: _not_agent(c) and bool(c.peer), lambda c: f"conns:{c.peer}",
        lambda lim, c: lim.connections_per_peer,
        "{method}: {peer} already holds streams on {n} connections, the per-address limit"
        " (max_connections_per_peer={limit}); reuse a channel"),
    Cap("public_per_peer", lambda c: c.pool is StreamPool.PUBLIC and bool(c.peer),
        lambda c: f"public:{c.peer}", lambda lim, c: lim.public_per_peer,
        "{method}: {peer} already has {n} open unauthenticated streams, the per-address limit"
        " (max_public_streams_per_peer={limit}); close some and retry"),
    Cap("per_peer", lambda c: _not_agent(c) and bool(c.peer), lambda c: f"peer:{c.peer}",
        lambda lim, c: lim.per_peer,
        "{method}: {peer} already has {n} open streams, the per-address limit"
        " (max_streams_per_peer={limit}); close some and retry"),
    Cap("per_team", lambda c: c.pool is StreamPool.USER and bool(c.team),
        lambda c: f"team:{c.team}", lambda lim, c: lim.per_team,
        "{method}: team {team} already has {n} open streams, the per-team limit"
        " (max_streams_per_team={limit}); close some (e.g. finished watches) and retry"),
    Cap("per_identity", lambda c: c.pool is not StreamPool.PUBLIC, lambda c: f"id:{c.owner}",
        lambda lim, c: lim.per_identity,
        "{method}: {owner} already has {n} open streams, the per-identity limit"
        " (max_streams_per_identity={limit}); close some (e.g. finished watches) and retry"),
)

_SETTING = {StreamPool.USER: "max_streams", StreamPool.AGENT: "max_agent_streams",
            StreamPool.PUBLIC: "max_public_streams"}


class StreamBudget:
    """Counts open streams; :meth:`acquire` admits or raises ResourceExhausted."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        # Open streams per connection ("ipv4:host:port"); a connection counts against its
        # peer's connection cap while it holds at least one stream.
        self._per_conn: Counter[str] = Counter()
        self.refused = 0  # streams refused since start (metrics, tests)

    @property
    def open(self) -> int:
        with self._lock:
            return sum(self._counts[f"pool:{p.value}"] for p in StreamPool)

    def open_in(self, pool: StreamPool) -> int:
        with self._lock:
            return self._counts[f"pool:{pool.value}"]

    def _keys(self, claim: StreamClaim) -> list[str]:
        return [cap.key(claim) for cap in CAPS if cap.applies(claim) and cap.name != "connections_per_peer"]

    def refusal(self, claim: StreamClaim, method: str) -> str:
        """Why a new stream for ``claim`` is refused ("" = admitted). Caller holds the lock."""
        for cap in CAPS:
            if not cap.applies(claim):
                continue
            key = cap.key(claim)
            n = self._counts[key]
            if cap.name == "connections_per_peer" and self._per_conn[claim.connection]:
                continue  # a connection already counted: no new connection
            limit = cap.limit(self.limits, claim)
            if n >= limit:
                return cap.message.format(method=method, n=n, limit=limit, pool=claim.pool.value,
                                          setting=_SETTING[claim.pool], peer=claim.peer,
                                          team=claim.team, owner=claim.owner)
        return ""

    def acquire(self, claim: StreamClaim, method: str) -> None:
        with self._lock:
            why = self.refusal(claim, method)
            if why:
                self.refused += 1
                raise ResourceExhausted(why)
            for key in self._keys(claim):
                self._counts[key] += 1
            if claim.connection and claim.peer and claim.pool is not StreamPool.AGENT:
                if not self._per_conn[claim.connection]:
                    self._counts[f"conns:{claim.peer}"] += 1
                self._per_conn[claim.connection] += 1

    def release(self, claim: StreamClaim) -> None:
        with self._lock:
            for key in self._keys(claim):
                self._dec(self._counts, key)
            if claim.connection and claim.peer and claim.pool is not StreamPool.AGENT:
                self._dec(self._per_conn, claim.connection)
                if not self._per_conn[claim.connection]:
                    self._dec(self._counts, f"conns:{claim.peer}")

    @staticmethod
    def _dec(counter: Counter[str], key: str) -> None:
        counter[key] -= 1
        if counter[key] <= 0:
            del counter[key]
