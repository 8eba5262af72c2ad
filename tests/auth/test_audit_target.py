"""The audit target of every request type equals the field-probing rule it replaced
(broker/auth/audit.py caches which fields each request type has)."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from broker.auth.audit import _TARGET_FIELDS, target_of
from computebroker.v1 import agent_pb2, auth_pb2, capacity_pb2, jobs_pb2, workdir_pb2


def probing(request: object) -> str:
    """The rule as first written: probe each name with getattr."""
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


def filled(cls: type, skip: frozenset[str] = frozenset()) -> Message:
    """An instance with every singular string field set (nested messages one level down),
    leaving out ``skip``."""
    msg = cls()
    for fd in msg.DESCRIPTOR.fields:
        if fd.name in skip or fd.is_repeated:
            continue
        if fd.type == FieldDescriptor.TYPE_STRING:
            setattr(msg, fd.name, f"{fd.name}-v")
        elif fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
            inner = getattr(msg, fd.name)
            for sub in fd.message_type.fields:
                if sub.type == FieldDescriptor.TYPE_STRING and not sub.is_repeated:
                    setattr(inner, sub.name, f"{sub.name}-v")
    return msg


def test_target_matches_the_probing_rule_for_every_request_type() -> None:
    checked = 0
    for module in (jobs_pb2, capacity_pb2, auth_pb2, agent_pb2, workdir_pb2):
        for name, desc in module.DESCRIPTOR.message_types_by_name.items():
            cls = getattr(module, name)
            for skip in (frozenset(), frozenset(_TARGET_FIELDS)):
                for msg in (cls(), filled(cls, skip)):
                    assert target_of(msg) == probing(msg), (desc.full_name, skip)
                    checked += 1
    assert checked > 100
    assert target_of(jobs_pb2.CancelJobRequest(job_id="j-1")) == "j-1"
    assert target_of("not a message") == ""
