"""The audit log: one record per mutating RPC (who, what, target, when, from where,
result), persisted in the store as keyed records so both stores (SQLite, Redis) hold it
with no schema change. Keys sort by time, so listing is chronological.

Why a bounded query in memory: the store's keyed-record interface lists a whole kind;
at one record per mutation that is fine for the tens of thousands of records a broker
keeps between operator exports. A dedicated index is the upgrade path.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from broker.auth.identity import Principal
from broker.ids import random_hex
from broker.store.base import Rider, Store, StoreError
from computebroker.v1 import auth_pb2 as apb

KIND_AUDIT = "audit"
log = logging.getLogger("broker.audit")

# Request fields that name what a mutation acts on, first match wins.
_TARGET_FIELDS = ("job_id", "token_id", "plan_id", "region", "node", "node_id", "user", "team",
                  "digest", "name")


def target_of(request: object) -> str:
    """What a request acts on, for the audit record (job id, team, region, ...)."""
    if not isinstance(request, Message):
        return ""
    direct, nested = _target_plan(request.DESCRIPTOR)
    for name in direct:
        value = getattr(request, name)
        if value:
            return value
    for sub, names in nested:
        if request.HasField(sub):
            inner = getattr(request, sub)
            for name in names:
                value = getattr(inner, name)
                if value:
                    return f"{sub}:{value}"
    return ""


# Per request type: its string fields among _TARGET_FIELDS, and its message fields
# ("spec", ...) with their own "team"/"name"/"region". Why: probing absent fields with
# getattr(..., None) raises and catches an AttributeError each, ~10% of the GIL time of a
# small RPC under 16 concurrent callers.
_PLANS: dict[Any, tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]] = {}


def _target_plan(desc: Any) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    plan = _PLANS.get(desc)
    if plan is None:
        def strings(d: Any, names: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(n for n in names if n in d.fields_by_name
                         and d.fields_by_name[n].type == FieldDescriptor.TYPE_STRING
                         and not d.fields_by_name[n].is_repeated)
        nested = []
        for sub in ("spec", "quota", "plan", "priority_class"):
            fd = desc.fields_by_name.get(sub)
            if fd is not None and fd.message_type is not None and not fd.is_repeated:
                nested.append((sub, strings(fd.message_type, ("team", "name", "region"))))
        plan = _PLANS[desc] = (strings(desc, _TARGET_FIELDS), tuple(nested))
    return plan


def _build(principal: Principal | None, method: str, target: str, peer: str, result: str,
           message: str = "") -> apb.AuditRecord:
    return apb.AuditRecord(
        id=f"{time.time_ns():020d}-{random_hex(3)}", time=time.time(),
        actor=principal.actor if principal else "anonymous",
        role=principal.role.value if principal else "", team=principal.team if principal else "",
        method=method, target=target[:200], peer=peer, result=result, message=message[:300])


def _log_line(rec: apb.AuditRecord, level: int | None = None) -> None:
    """The record as a log line: INFO for a refusal or failure, DEBUG for an allowed
    call (the store holds every record; a line per submit at thousands a second is
    noise, and its formatting cost the API a few percent of its CPU)."""
    if level is None:
        level = logging.DEBUG if rec.result == "OK" else logging.INFO
    if log.isEnabledFor(level):
        log.log(level, "audit %s %s %s target=%s peer=%s -> %s", rec.actor, rec.role, rec.method,
                rec.target, rec.peer, rec.result)


class PendingAudit:
    """The audit record of the mutating RPC running in this context, not yet written.

    Why: a SubmitJob's job creation commits in a group (one transaction and fsync for
    every submit queued meanwhile); writing the audit record afterwards cost every
    submit a second commit to wait for. Instead the job write takes the record along
    (:meth:`rider`: result OK, committed in the same transaction and only if the job
    is written, broker/jobs/applier.py); once that commit succeeded
    (:meth:`committed`) the interceptor writes nothing more. Any other ending (a
    refusal, a duplicate request id answered with the existing job, a failed write)
    leaves it unwritten and the interceptor records the call's real result, as for
    every other RPC. The record describes the mutation: it says OK once the job is
    durable, whatever happens to the answer after that."""

    __slots__ = ("principal", "method", "target", "peer", "_rec", "written")

    def __init__(self, principal: Principal, method: str, target: str, peer: str) -> None:
        self.principal, self.method, self.target, self.peer = principal, method, target, peer
        self._rec: apb.AuditRecord | None = None
        self.written = False

    def rider(self) -> Rider:
        """The record (result OK) to commit together with the mutation's write."""
        self._rec = _build(self.principal, self.method, self.target, self.peer, "OK")
        return (KIND_AUDIT, self._rec.id, self._rec)

    def committed(self) -> None:
        """The write that carried :meth:`rider` is durable: the record is stored."""
        if self._rec is not None and not self.written:
            self.written = True
            _log_line(self._rec)


_PENDING: ContextVar[PendingAudit | None] = ContextVar("cb_pending_audit", default=None)


def pending_audit() -> PendingAudit | None:
    """The running RPC's audit record while it may still ride along a job write."""
    p = _PENDING.get()
    return p if p is not None and not p.written else None


class AuditLog:
    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, principal: Principal | None, method: str, target: str, peer: str,
               result: str, message: str = "") -> None:
        rec = _build(principal, method, target, peer, result, message)
        _log_line(rec)
        try:
            self.store.put_record(KIND_AUDIT, rec.id, rec)
        except StoreError as e:  # never fail the RPC after it happened; the log line stays
            _log_line(rec, logging.WARNING)
            log.warning("audit record not stored: %s", e)

    @staticmethod
    def begin(pending: PendingAudit) -> object:
        """Make ``pending`` this context's audit record (the token for :meth:`end`)."""
        return _PENDING.set(pending)

    @staticmethod
    def end(token: object) -> None:
        _PENDING.reset(token)  # type: ignore[arg-type]

    def query(self, actor: str = "", since: float = 0.0, limit: int = 100) -> list[apb.AuditRecord]:
        recs: list[apb.AuditRecord] = self.store.list_records(KIND_AUDIT, apb.AuditRecord)  # type: ignore[assignment]
        out = [r for r in recs if r.time >= since and (
            not actor or r.actor == actor or r.actor.split(":", 1)[-1] == actor)]
        out.reverse()
        return out[:limit]
