"""The audit log: one record per mutating RPC (who, what, target, when, from where,
result), persisted in the store as keyed records so both stores (SQLite, Redis) hold it
with no schema change. Keys sort by time, so listing is chronological.

Why a bounded query in memory: the store's keyed-record interface lists a whole kind;
at one record per mutation that is fine for the tens of thousands of records a broker
keeps between operator exports. A dedicated index is the upgrade path.
"""

from __future__ import annotations

import logging
import secrets
import time

from google.protobuf.message import Message

from broker.auth.identity import Principal
from broker.store.base import Store, StoreError
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
    for name in _TARGET_FIELDS:
        value = getattr(request, name, None)
        if isinstance(value, str) and value:
            return value
    for sub in ("spec", "quota", "plan", "priority_class"):
        inner = getattr(request, sub, None)
        if isinstance(inner, Message):
            for name in ("team", "name", "region"):
                value = getattr(inner, name, None)
                if isinstance(value, str) and value:
                    return f"{sub}:{value}"
    return ""


class AuditLog:
    def __init__(self, store: Store) -> None:
        self.store = store

    def record(self, principal: Principal | None, method: str, target: str, peer: str,
               result: str, message: str = "") -> None:
        now = time.time()
        rec = apb.AuditRecord(
            id=f"{time.time_ns():020d}-{secrets.token_hex(3)}", time=now,
            actor=principal.actor if principal else "anonymous",
            role=principal.role.value if principal else "", team=principal.team if principal else "",
            method=method, target=target[:200], peer=peer, result=result, message=message[:300])
        log.info("audit %s %s %s target=%s peer=%s -> %s", rec.actor, rec.role, method, rec.target,
                 peer, result)
        try:
            self.store.put_record(KIND_AUDIT, rec.id, rec)
        except StoreError as e:  # never fail the RPC after it happened; the log line stays
            log.warning("audit record not stored: %s", e)

    def query(self, actor: str = "", since: float = 0.0, limit: int = 100) -> list[apb.AuditRecord]:
        recs: list[apb.AuditRecord] = self.store.list_records(KIND_AUDIT, apb.AuditRecord)  # type: ignore[assignment]
        out = [r for r in recs if r.time >= since and (
            not actor or r.actor == actor or r.actor.split(":", 1)[-1] == actor)]
        out.reverse()
        return out[:limit]
