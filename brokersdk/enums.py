"""Enum names for people: parse "on-demand" into the wire enum and back, and the terminal phases."""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from typing import Any

import grpc

from brokersdk.errors import InvalidJobSpec
from computebroker.v1 import capacity_pb2, common_pb2

# Node label the broker sets on a spot node its agent gave an interruption notice for (the
# value: the reclaim deadline, epoch seconds). Why a label: Node has no field for it, and
# "unhealthy" alone hides that the cloud is taking the node back.
SPOT_NOTICE_LABEL = "computebroker.io/spot-notice-deadline"

TERMINAL_PHASES = frozenset(
    {
        common_pb2.JOB_PHASE_SUCCEEDED,
        common_pb2.JOB_PHASE_FAILED,
        common_pb2.JOB_PHASE_CANCELLED,
    }
)


def _enum_parser(prefix: str, enum: Any, aliases: Mapping[str, str] | None = None):
    def parse(value: str | int) -> int:
        if isinstance(value, int):
            return value
        key = str(value).strip().lower().replace("-", "_")
        key = (aliases or {}).get(key, key)
        full = key.upper() if key.upper().startswith(prefix) else prefix + key.upper()
        try:
            return enum.Value(full)
        except ValueError:
            choices = ", ".join(
                v.name[len(prefix) :].lower().replace("_", "-")
                for v in enum.DESCRIPTOR.values
                if not v.name.endswith("UNSPECIFIED")
            )
            raise InvalidJobSpec(
                f"unknown value {value!r}; expected one of: {choices}",
                grpc.StatusCode.INVALID_ARGUMENT,
            ) from None

    def name(value: int) -> str:
        try:
            n = enum.Name(value)
        except ValueError:
            return str(value)
        if n.endswith("UNSPECIFIED"):
            return ""
        return n[len(prefix) :].lower().replace("_", "-")

    return parse, name


parse_phase, phase_name = _enum_parser("JOB_PHASE_", common_pb2.JobPhase)
parse_capacity_type, capacity_type_name = _enum_parser(
    "CAPACITY_TYPE_", common_pb2.CapacityType, {"ondemand": "on_demand", "plan": "training_plan"}
)
parse_topology, topology_name = _enum_parser(
    "TOPOLOGY_LEVEL_",
    common_pb2.TopologyLevel,
    {"l1": "layer_1", "l2": "layer_2", "l3": "layer_3", "spine": "layer_1", "block": "layer_3"},
)
parse_strategy, strategy_name = _enum_parser("LENDING_STRATEGY_", capacity_pb2.LendingStrategy)
parse_plan_state, plan_state_name = _enum_parser("PLAN_STATE_", capacity_pb2.PlanState)


def _py_enum(name: str, prefix: str, enum: Any) -> type[IntEnum]:
    """A Python IntEnum twin of a proto enum: equal to the wire integers, but printed as
    its name (``str(Phase.RUNNING) == "running"``) so SDK users never see bare numbers."""
    members = {v.name[len(prefix):]: v.number for v in enum.DESCRIPTOR.values}
    cls = IntEnum(name, members)  # type: ignore[misc]

    def __str__(self: IntEnum) -> str:
        return "" if self.name == "UNSPECIFIED" else self.name.lower().replace("_", "-")

    cls.__str__ = __str__  # type: ignore[method-assign]
    cls.__format__ = lambda self, spec: format(str(self), spec)  # type: ignore[method-assign]
    return cls


# Typed names for the integers in Job.phase, Migration.cause_code / state_code and
# capacity types: Phase(job.phase) prints "succeeded", MigrationCause(m.cause_code)
# prints "spot-interruption".
Phase = _py_enum("Phase", "JOB_PHASE_", common_pb2.JobPhase)
MigrationCause = _py_enum("MigrationCause", "MIGRATION_CAUSE_", common_pb2.MigrationCause)
MigrationState = _py_enum("MigrationState", "MIGRATION_STATE_", common_pb2.MigrationState)
CapacityType = _py_enum("CapacityType", "CAPACITY_TYPE_", common_pb2.CapacityType)


def cause_name(m: common_pb2.Migration) -> str:
    """A move's cause as a name: the typed cause when set, else the recorded string."""
    if m.cause_code:
        return str(MigrationCause(m.cause_code))
    return m.cause.replace("_", "-")
