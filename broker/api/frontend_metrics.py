"""An API front-end's own metrics, served on the same Prometheus endpoint as a broker's.

Why its own series: a front-end never schedules, so the leader's gauges (pending jobs,
GPUs, agents) would be empty or wrong on it. What an operator asks of a front-end is
whether it takes submits, whether it still hears the store bus (broker/api/store_bus.py)
and what it turns away, so those are counted here (docs/operator/observability.md):

* ``computebroker_frontend_submits_total{outcome}``: SubmitJob calls answered, ``created``
  (a new job) or ``existing`` (a retried request id answered with its first job);
* ``computebroker_frontend_bus_reconnects_total{topic}``: store-bus subscriptions made
  again after the first (Redis restarts, failovers, dropped links);
* ``computebroker_frontend_bus_connected``: 1 while the bus is subscribed (calls are
  served), 0 while it is not (calls are refused, health is NOT_SERVING);
* ``computebroker_frontend_refusals_total{reason}``: calls answered UNAVAILABLE by the
  front-end itself, by :class:`Refusal`;
* ``computebroker_frontend_proxied_total{code}``: calls sent on to the leader
  (broker/api/leader_proxy.py), by the leader's answer (OK, NOT_FOUND, ...; UNAVAILABLE
  also when the leader did not answer).

Counted in plain integers on the call path (no OpenTelemetry call per submit) and read by
observable instruments at scrape time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import StrEnum
from typing import Any

METRIC_NAMES = {
    "submits": "computebroker_frontend_submits_total",
    "bus_reconnects": "computebroker_frontend_bus_reconnects_total",
    "bus_connected": "computebroker_frontend_bus_connected",
    "refusals": "computebroker_frontend_refusals_total",
    "proxied": "computebroker_frontend_proxied_total",
}


class Refusal(StrEnum):
    """Why a front-end answered a call UNAVAILABLE."""

    LEADER_UNKNOWN = "leader_unknown"  # a call for the leader, and no leader is on record
    STORE_UNREACHABLE = "store_unreachable"  # the store bus is down: nothing is served


class FrontendCounters:
    """The counts behind the series above. ``bus``: callables giving the store bus's
    state (``reconnects()`` per topic and ``connected()``), read at scrape time."""

    def __init__(self, reconnects: Callable[[], dict[str, int]],
                 connected: Callable[[], bool]) -> None:
        self._reconnects, self._connected = reconnects, connected
        self._lock = threading.Lock()
        self.submits = {"created": 0, "existing": 0}
        self.refusals = {r: 0 for r in Refusal}
        self.proxied: dict[str, int] = {}

    def submitted(self, created: bool) -> None:
        with self._lock:
            self.submits["created" if created else "existing"] += 1

    def refused(self, why: Refusal) -> None:
        with self._lock:
            self.refusals[why] += 1

    def forwarded(self, code: Any) -> None:
        """A call sent on to the leader ended with ``code`` (a grpc.StatusCode)."""
        with self._lock:
            self.proxied[code.name] = self.proxied.get(code.name, 0) + 1

    def register(self, meter: Any) -> None:
        """Observable instruments on ``meter`` (BrokerTelemetry.start_metrics' hook)."""
        from opentelemetry.metrics import Observation

        def submits(_options: Any) -> list[Any]:
            with self._lock:
                return [Observation(n, {"outcome": k}) for k, n in self.submits.items()]

        def refusals(_options: Any) -> list[Any]:
            with self._lock:
                return [Observation(n, {"reason": r.value}) for r, n in self.refusals.items()]

        def proxied(_options: Any) -> list[Any]:
            with self._lock:
                return [Observation(n, {"code": c}) for c, n in self.proxied.items()]

        def reconnects(_options: Any) -> list[Any]:
            return [Observation(n, {"topic": t}) for t, n in self._reconnects().items()]

        def connected(_options: Any) -> list[Any]:
            return [Observation(1 if self._connected() else 0)]

        meter.create_observable_counter(
            "computebroker.frontend.submits", callbacks=[submits],
            description="SubmitJob calls this API front-end answered, by outcome (created, existing)")
        meter.create_observable_counter(
            "computebroker.frontend.bus_reconnects", callbacks=[reconnects],
            description="store-bus subscriptions made again after the first, by topic")
        meter.create_observable_gauge(
            "computebroker.frontend.bus_connected", callbacks=[connected],
            description="1 while the store bus is subscribed and calls are served, else 0")
        meter.create_observable_counter(
            "computebroker.frontend.refusals", callbacks=[refusals],
            description="calls this API front-end answered UNAVAILABLE itself, by reason")
        meter.create_observable_counter(
            "computebroker.frontend.proxied", callbacks=[proxied],
            description="calls this API front-end sent on to the leader, by the answer's code")
