"""Edge validation: every request is checked here before it can touch state.

Two kinds of refusal: a *malformed* request is INVALID_ARGUMENT
(fix the spec), an *impossible* one is FAILED_PRECONDITION (the spec is fine but
this broker can never run it as things stand: unknown team, bigger than any
cluster). Messages name the field, the bad value and what would be accepted.
"""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Iterable, Mapping

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from broker.api.errors import FailedPrecondition, InvalidArgument
from broker.api.limits import (
    DEFAULT_BYTES,
    DEFAULT_ITEMS,
    DEFAULT_STRING,
    LIMITS,
    MAX_GPUS_PER_NODE,
    FieldLimit,
    Kind,
)
from broker.jobs.recovery import POLICIES, POLICY_LABEL
from checkpoint_layout import job_options
from checkpoint_layout.roots import RootError, canonical, check_under
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import capacity_pb2 as cpb
from computebroker.v1 import common_pb2 as pb

TEAM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Every key of a spec's env at once, joined by newlines (see _env_ok).
_ENV_KEYS_RE = re.compile(r"(?:[A-Za-z_][A-Za-z0-9_]*\n)*[A-Za-z_][A-Za-z0-9_]*")
MAX_NODES = 10_000
MAX_NAME = 200
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)
_INTS = (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
         FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64)


# ---- the generic edge check: LIMITS (broker/api/limits.py) over any message ----------------
def limit_for(message_name: str, field_name: str) -> FieldLimit | None:
    """The row of LIMITS for one field: ``Message.field`` first, then ``field``."""
    return LIMITS.get(f"{message_name}.{field_name}") or LIMITS.get(field_name)


# The ASCII members of Unicode category C: C0 controls and DEL (nothing else below 0x80).
_ASCII_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def bad_char(value: str) -> str | None:
    """The first control/format character of ``value`` (C0/C1 controls, ESC, bidi
    overrides, zero-width chars), or None. Such characters in an identifier would
    rewrite an operator's terminal or make two different ids look the same.

    Why the ASCII fast path: every string of every request passes here (a 2 KB spec
    has ~70); a regex over an ASCII string is exact and ~20x cheaper than the
    per-character category lookup, which stays for non-ASCII text."""
    if value.isascii():
        m = _ASCII_CONTROL.search(value)
        return m.group() if m else None
    for ch in value:
        if unicodedata.category(ch)[0] == "C":
            return ch
    return None


def _show(value: object, width: int = 40) -> str:
    """A short, escaped rendering of a refused value for error messages."""
    text = repr(value)
    return text if len(text) <= width else text[:width] + f"... ({len(str(value))} chars)"


def check_text(path: str, value: str, limit: FieldLimit) -> None:
    max_len = limit.max_len if limit.max_len is not None else DEFAULT_STRING.max_len
    if max_len is not None and len(value) > max_len:
        raise InvalidArgument(f"{path} is {len(value)} characters long; at most {max_len}")
    if (limit.kind or DEFAULT_STRING.kind) is Kind.IDENTIFIER:
        ch = bad_char(value)
        if ch is not None:
            raise InvalidArgument(
                f"{path} {_show(value)} contains the control character U+{ord(ch):04X};"
                " identifiers, names and labels must be printable text")


def check_number(path: str, value: float, limit: FieldLimit | None) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        if limit is not None and not limit.finite:
            return
        raise InvalidArgument(f"{path} is {value}; numbers must be finite")
    if limit is None:
        return
    if limit.lo is not None and value < limit.lo:
        raise InvalidArgument(f"{path} = {value} is below the minimum {limit.lo:g}")
    if limit.hi is not None and value > limit.hi:
        raise InvalidArgument(f"{path} = {value} exceeds the maximum {limit.hi:g}")


def _scalar_ok(fd: FieldDescriptor, value: object, limit: FieldLimit | None) -> bool:
    """True when ``value`` certainly passes :func:`_check_scalar` (strings and numbers,
    the fields a request is made of); False means "run the full check", which builds
    the field's path and raises with it. Why: the path strings (``spec.env['K']``) cost
    more than the checks themselves and are only needed in a refusal."""
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        lim = limit or DEFAULT_STRING
        max_len = lim.max_len if lim.max_len is not None else DEFAULT_STRING.max_len
        if max_len is not None and len(value) > max_len:  # type: ignore[arg-type]
            return False
        return (lim.kind or DEFAULT_STRING.kind) is not Kind.IDENTIFIER or (
            value.isascii() and _ASCII_CONTROL.search(value) is None)  # type: ignore[union-attr]
    if t in _INTS or t in _FLOATS:
        if t in _FLOATS and not math.isfinite(value):  # type: ignore[arg-type]
            return False
        return limit is None or ((limit.lo is None or value >= limit.lo)  # type: ignore[operator]
                                 and (limit.hi is None or value <= limit.hi))  # type: ignore[operator]
    if t == FieldDescriptor.TYPE_BOOL:
        return True
    if t == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values_by_number.get(value) is not None  # type: ignore[arg-type]
    return False


def _strings_ok(values: list[str], limit: FieldLimit | None) -> bool:
    """:func:`_scalar_ok` for many strings of one field at once (a map's keys or
    values, a repeated string): one length scan and one regex over their
    concatenation instead of a Python call per string (a 2 KB spec has ~70)."""
    if not values:
        return True
    lim = limit or DEFAULT_STRING
    max_len = lim.max_len if lim.max_len is not None else DEFAULT_STRING.max_len
    if max_len is not None and max(map(len, values)) > max_len:
        return False
    if (lim.kind or DEFAULT_STRING.kind) is not Kind.IDENTIFIER:
        return True
    joined = "".join(values)
    return joined.isascii() and _ASCII_CONTROL.search(joined) is None


def _check_scalar(path: str, fd: FieldDescriptor, value: object, limit: FieldLimit | None) -> None:
    if fd.type == FieldDescriptor.TYPE_STRING:
        check_text(path, value, limit or DEFAULT_STRING)  # type: ignore[arg-type]
    elif fd.type == FieldDescriptor.TYPE_BYTES:
        cap = limit.max_len if limit and limit.max_len is not None else DEFAULT_BYTES
        if len(value) > cap:  # type: ignore[arg-type]
            raise InvalidArgument(f"{path} is {len(value)} bytes; at most {cap}")  # type: ignore[arg-type]
    elif fd.type in _FLOATS or fd.type in _INTS:
        check_number(path, value, limit)  # type: ignore[arg-type]
    elif fd.type == FieldDescriptor.TYPE_ENUM and fd.enum_type.values_by_number.get(value) is None:
        words = re.sub(r"(?<!^)([A-Z])", r" \1", fd.enum_type.name).lower()
        prefix = re.sub(r"(?<!^)([A-Z])", r"_\1", fd.enum_type.name).upper() + "_"
        known = ", ".join(v.name.removeprefix(prefix).lower() for v in fd.enum_type.values if v.number)
        raise InvalidArgument(f"{path} = {value} is not a {words}; use one of {known}")
    elif fd.type == FieldDescriptor.TYPE_MESSAGE:
        check_message(value, path + ".")  # type: ignore[arg-type]


# Per field descriptor: (limit, is a map, map key/value descriptors and limits). Why a
# cache: the LIMITS lookups and descriptor options cost more than checking the values.
_FieldPlan = tuple[FieldLimit | None, bool, FieldDescriptor | None, FieldDescriptor | None,
                   FieldLimit | None, FieldLimit | None]
_PLANS: dict[FieldDescriptor, _FieldPlan] = {}


def _plan(mname: str, fd: FieldDescriptor) -> _FieldPlan:
    plan = _PLANS.get(fd)
    if plan is None:
        limit = limit_for(mname, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            plan = (limit, True, fd.message_type.fields_by_name["key"],
                    fd.message_type.fields_by_name["value"],
                    LIMITS.get(f"{fd.name}.key"), LIMITS.get(f"{fd.name}.value"))
        else:
            plan = (limit, False, None, None, None, None)
        _PLANS[fd] = plan
    return plan


def check_message(msg: Message, prefix: str = "") -> None:
    """Apply LIMITS to every set field of ``msg``, recursively; raise InvalidArgument
    naming the first offending field (``spec.labels['k']``), its value and the limit.

    Unknown fields are dropped first (a newer client's fields are not stored blindly).
    """
    msg.DiscardUnknownFields()
    mname = msg.DESCRIPTOR.name
    for fd, value in msg.ListFields():
        path = prefix + fd.name
        limit, is_map, kfd, vfd, klim, vlim = _plan(mname, fd)
        if is_map:
            cap = limit.max_items if limit and limit.max_items is not None else DEFAULT_ITEMS
            if len(value) > cap:
                raise InvalidArgument(f"{path} has {len(value)} entries; at most {cap}")
            assert kfd is not None and vfd is not None
            if kfd.type == vfd.type == FieldDescriptor.TYPE_STRING:
                keys = list(value)
                if _strings_ok(keys, klim) and _strings_ok([value[k] for k in keys], vlim):
                    continue  # all fine; else the loop below names the first bad entry
            for k, v in value.items():
                if not _scalar_ok(kfd, k, klim):
                    _check_scalar(f"{path} key", kfd, k, klim)
                if not _scalar_ok(vfd, v, vlim):
                    _check_scalar(f"{path}[{_show(k, 30)}]", vfd, v, vlim)
        elif fd.is_repeated:
            cap = limit.max_items if limit and limit.max_items is not None else DEFAULT_ITEMS
            if len(value) > cap:
                raise InvalidArgument(f"{path} has {len(value)} entries; at most {cap}")
            if fd.type == FieldDescriptor.TYPE_STRING and _strings_ok(list(value), limit):
                continue
            for i, item in enumerate(value):
                if not _scalar_ok(fd, item, limit):
                    _check_scalar(f"{path}[{i}]", fd, item, limit)
        elif not _scalar_ok(fd, value, limit):
            _check_scalar(path, fd, value, limit)


def _level_name(level: int) -> str:
    return pb.TopologyLevel.Name(level).removeprefix("TOPOLOGY_LEVEL_").lower()


def validate_team_name(team: str, field: str = "team") -> None:
    if not team:
        raise InvalidArgument(f"{field} is empty: every job and quota belongs to a team")
    if not TEAM_RE.match(team):
        raise InvalidArgument(
            f"{field} {team!r} is not a valid team name: use 1-63 letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )


def validate_checkpoint_uri(uri: str, field: str = "checkpoint_uri",
                           roots: Iterable[str] | None = None) -> None:
    """Allowed: empty (broker default), /abs/path, file:///abs/path, s3://bucket[/prefix],
    without '.'/'..' segments; with ``roots``, only under one of them (issue 12:
    ``/etc/cron.d`` and ``file:///etc/passwd`` were accepted)."""
    if not uri:
        return
    if uri.startswith("s3://"):
        bucket = uri[len("s3://"):].split("/", 1)[0]
        if not S3_BUCKET_RE.match(bucket):
            raise InvalidArgument(
                f"{field} {uri!r}: {bucket!r} is not a valid S3 bucket name"
                " (3-63 lowercase letters, digits, '.', '-')"
            )
    elif "://" in uri and not uri.startswith("file://") or not uri.startswith(("/", "file://")):
        raise InvalidArgument(
            f"{field} {uri!r}: unsupported location; use an absolute path (/data/ckpt),"
            " file:///data/ckpt or s3://bucket/prefix (or leave it empty for the broker default)"
        )
    try:
        if roots is None:
            canonical(uri)
        else:
            check_under(uri, roots, field)
    except RootError as e:
        raise InvalidArgument(str(e)) from e


def validate_priority_class(pc: cpb.PriorityClass) -> None:
    """A class name is an identifier like a team name; the value is an int32 (the edge
    limits bound it, broker/api/limits.py); the description is free text."""
    if not pc.name:
        raise InvalidArgument("priority_class.name is empty: name the class")
    if not TEAM_RE.match(pc.name):
        raise InvalidArgument(f"priority_class.name {pc.name!r}: use 1-63 letters, digits, '.', '_'"
                              " or '-', starting with a letter or digit")


_LEVELS = frozenset(pb.TopologyLevel.values())
_CAPACITY_TYPES = frozenset(pb.CapacityType.values()) - {pb.CAPACITY_TYPE_UNSPECIFIED}


def validate_spec(spec: pb.JobSpec, priority_classes: dict[str, int]) -> None:
    """Raise InvalidArgument when ``spec`` is malformed."""
    if not spec.name.strip():
        raise InvalidArgument("spec.name is empty: give the job a name")
    if len(spec.name) > MAX_NAME:
        raise InvalidArgument(f"spec.name is {len(spec.name)} characters long; at most {MAX_NAME}")
    validate_team_name(spec.team, "spec.team")
    if spec.priority_class and spec.priority_class not in priority_classes:
        known = ", ".join(sorted(priority_classes, key=lambda c: -priority_classes[c]))
        raise InvalidArgument(
            f"spec.priority_class {spec.priority_class!r} is unknown; known classes: {known}"
        )
    policy = spec.labels.get(POLICY_LABEL, "")
    if policy and policy not in POLICIES:
        raise InvalidArgument(f"label {POLICY_LABEL} {policy!r} is unknown;"
                              f" known: {', '.join(sorted(POLICIES))}")
    if not spec.HasField("resources"):
        raise InvalidArgument("spec.resources is missing: say nodes and gpus_per_node")
    r = spec.resources
    if r.nodes <= 0:
        raise InvalidArgument(f"spec.resources.nodes must be at least 1 (got {r.nodes})")
    if r.nodes > MAX_NODES:
        raise InvalidArgument(f"spec.resources.nodes {r.nodes} exceeds the limit of {MAX_NODES}")
    if r.gpus_per_node <= 0:
        raise InvalidArgument(
            f"spec.resources.gpus_per_node must be at least 1 (got {r.gpus_per_node})"
        )
    if r.gpus_per_node > MAX_GPUS_PER_NODE:
        raise InvalidArgument(
            f"spec.resources.gpus_per_node {r.gpus_per_node} exceeds the limit of {MAX_GPUS_PER_NODE}"
        )
    levels = _LEVELS
    for fname in ("required", "preferred"):
        level = getattr(spec.topology, fname)
        if level not in levels:
            raise InvalidArgument(
                f"spec.topology.{fname} = {level} is not a topology level; use one of "
                + ", ".join(_level_name(v) for v in sorted(levels) if v)
            )
    req, pref = spec.topology.required, spec.topology.preferred
    if req and pref and pref > req:
        raise InvalidArgument(
            f"spec.topology.preferred ({_level_name(pref)}) is looser than required "
            f"({_level_name(req)}); preferred must be the same or a tighter level"
        )
    e = spec.elasticity
    if e.min_nodes or e.max_nodes:
        if e.min_nodes < 1 or e.max_nodes < 1:
            raise InvalidArgument(
                f"spec.elasticity: min_nodes ({e.min_nodes}) and max_nodes ({e.max_nodes}) must"
                " both be at least 1 (or both 0 for a fixed size)"
            )
        if e.min_nodes > e.max_nodes:
            raise InvalidArgument(
                f"spec.elasticity.min_nodes ({e.min_nodes}) is greater than max_nodes ({e.max_nodes})"
            )
        if not e.min_nodes <= r.nodes <= e.max_nodes:
            raise InvalidArgument(
                f"spec.resources.nodes ({r.nodes}) must lie within spec.elasticity"
                f" [{e.min_nodes}, {e.max_nodes}]"
            )
    validate_checkpoint_uri(spec.checkpoint_uri, "spec.checkpoint_uri")
    ctypes = _CAPACITY_TYPES
    for ct in spec.capacity_types:
        if ct not in ctypes:
            raise InvalidArgument(
                f"spec.capacity_types contains {ct}; use on_demand, spot, training_plan or reserved"
            )
    overlap = set(spec.allowed_regions) & set(spec.denied_regions)
    if overlap:
        raise InvalidArgument(
            f"regions {sorted(overlap)} are both allowed and denied in the spec; pick one"
        )
    if any(not x for x in [*spec.allowed_regions, *spec.denied_regions, *spec.preferred_regions]):
        raise InvalidArgument("spec region lists must not contain empty names")
    if spec.max_price_per_gpu_hour < 0:
        raise InvalidArgument("spec.max_price_per_gpu_hour must be >= 0 (0 = no limit)")
    if spec.expected_duration_s < 0:
        raise InvalidArgument("spec.expected_duration_s must be >= 0")
    t = spec.trainer
    for fname in ("total_steps", "checkpoint_every", "global_batch_size", "step_sleep_s"):
        if getattr(t, fname) < 0:
            raise InvalidArgument(f"spec.trainer.{fname} must be >= 0 (got {getattr(t, fname)})")
    try:  # the one options table: every reader parses them the same way
        job_options.parse(t.options)
    except job_options.OptionError as e:
        raise InvalidArgument(f"spec.trainer.options: {e}") from None
    if not spec.command:
        # Our trainer runs the job: catch at submit what it would refuse only after a
        # placement and a launch (it exits 2 on these).
        if t.total_steps < 1:
            raise InvalidArgument(
                "spec.trainer.total_steps must be >= 1 for the built-in trainer "
                "(or give spec.command to run your own program)"
            )
        if t.global_batch_size < 1:
            raise InvalidArgument(
                "spec.trainer.global_batch_size must be >= 1: it is the number of samples per "
                "global step, fixed whatever the world size"
            )
    if not _env_ok(spec.env):
        for key in spec.env:
            if not ENV_KEY_RE.match(key):
                raise InvalidArgument(f"spec.env key {key!r} is not a valid environment variable name")
            if key.startswith("CB_"):
                raise InvalidArgument(f"spec.env key {key!r}: CB_* variables are set by the broker")
            if "\x00" in spec.env[key]:  # execve cannot pass it: every launch would fail
                raise InvalidArgument(f"spec.env[{key!r}] contains a NUL character, which no"
                                      " process environment can hold")


def _env_ok(env: Mapping[str, str]) -> bool:
    """True when every key of ``env`` is a variable name not starting ``CB_`` and no
    value holds a NUL: one regex and two scans over the joined keys and values instead
    of three Python steps per variable (a spec of 40 variables: ~2/3 of the spec check).
    False means "look at each one", which names the first bad variable."""
    if not env:
        return True
    keys = list(env)
    joined = "\n".join(keys)
    return (joined.count("\n") == len(keys) - 1 and _ENV_KEYS_RE.fullmatch(joined) is not None
            and not joined.startswith("CB_") and "\nCB_" not in joined
            and "\x00" not in "".join([env[k] for k in keys]))


def check_feasible(spec: pb.JobSpec, clusters: Iterable[list[pb.Node]]) -> None:
    """Raise FailedPrecondition when no registered cluster could ever run ``spec``.

    ``clusters``: the nodes of each registered agent (connected or not). Called only
    when at least one agent has registered; before that every job waits.
    """
    clusters = [c for c in clusters if c]
    if not clusters:
        return
    r = spec.resources
    acc = r.accelerator
    nodes = [n for c in clusters for n in c if not acc or n.accelerator == acc]
    if not nodes:
        have = sorted({n.accelerator for c in clusters for n in c if n.accelerator})
        raise FailedPrecondition(
            f"no registered node has accelerator {acc!r}; registered accelerators: {', '.join(have) or 'none'}"
        )
    biggest_node = max(n.gpus for n in nodes)
    if r.gpus_per_node > biggest_node:
        raise FailedPrecondition(
            f"the job asks {r.gpus_per_node} GPUs per node but the largest registered node"
            f"{' of ' + acc if acc else ''} has {biggest_node}"
        )
    need_nodes = spec.elasticity.min_nodes or r.nodes
    best = 0
    for c in clusters:
        fit = [n for n in c if (not acc or n.accelerator == acc) and n.gpus >= r.gpus_per_node]
        best = max(best, len(fit))
    if need_nodes > best:
        raise FailedPrecondition(
            f"the job needs {need_nodes} node(s) x {r.gpus_per_node} GPU(s)"
            f" ({need_nodes * r.gpus_per_node} GPUs in one cluster) but the largest registered"
            f" cluster has only {best} node(s) with {r.gpus_per_node}+ GPUs"
        )


def validate_plan(plan: cpb.TrainingPlan) -> None:
    if not plan.region:
        raise InvalidArgument("plan.region is required")
    if not plan.instance_type and not plan.accelerator:
        raise InvalidArgument("plan.instance_type (or plan.accelerator) is required")
    if plan.instance_count <= 0:
        raise InvalidArgument(f"plan.instance_count must be at least 1 (got {plan.instance_count})")
    if plan.gpus_per_instance < 0:
        raise InvalidArgument("plan.gpus_per_instance must be >= 0")
    if plan.start_time <= 0 or plan.end_time <= 0:
        raise InvalidArgument("plan.start_time and plan.end_time are required (Unix seconds)")
    if plan.start_time >= plan.end_time:
        raise InvalidArgument(
            f"plan.start_time ({plan.start_time}) must be before plan.end_time ({plan.end_time})"
        )
    if plan.price_per_gpu_hour < 0:
        raise InvalidArgument("plan.price_per_gpu_hour must be >= 0")
    if plan.team:
        validate_team_name(plan.team, "plan.team")


def validate_quota(q: cpb.TeamQuota) -> None:
    validate_team_name(q.team, "quota.team")
    if q.fair_share_weight < 0:
        raise InvalidArgument("quota.fair_share_weight must be >= 0")
    if q.strategy not in cpb.LendingStrategy.values():
        raise InvalidArgument(f"quota.strategy {q.strategy} is not a lending strategy")
    seen: set[str] = set()
    for e in q.quotas:
        if e.accelerator in seen:
            raise InvalidArgument(f"quota entry for accelerator {e.accelerator!r} appears twice")
        seen.add(e.accelerator)
        if e.guaranteed_gpus < 0:
            raise InvalidArgument(f"guaranteed_gpus must be >= 0 (got {e.guaranteed_gpus})")
        if e.HasField("borrow_limit_gpus") and e.borrow_limit_gpus < 0:
            raise InvalidArgument("borrow_limit_gpus must be >= 0")
        if e.HasField("lend_limit_gpus") and e.lend_limit_gpus < 0:
            raise InvalidArgument("lend_limit_gpus must be >= 0")
        for region, cap in e.region_caps.items():
            if cap < 0 or not region:
                raise InvalidArgument(f"region cap {region!r}={cap} is invalid")


def validate_register(reg: apb.Register) -> None:
    """An agent's inventory, checked like user input (issue 12: ``capacity_type=99``
    made every scheduler pass raise; two 2^31-1 GPU nodes overflowed the int32 totals).
    The edge already applied LIMITS (enums, GPU and price ranges, NaN); these are the
    rules across fields. Also applied to inventories read back from the store."""
    check_message(reg)
    if not reg.agent_id:
        raise InvalidArgument("Register.agent_id is empty")
    if not reg.region:
        raise InvalidArgument("Register.region is empty")
    seen: set[str] = set()
    for n in reg.nodes:
        if not n.id:
            raise InvalidArgument("a registered node has an empty id")
        if n.id in seen:
            raise InvalidArgument(f"node id {n.id!r} appears twice in Register")
        seen.add(n.id)
        if n.region and n.region != reg.region:
            raise InvalidArgument(f"node {n.id!r} says region {n.region!r} but the agent"
                                  f" registers region {reg.region!r}")
        if n.gpus > MAX_GPUS_PER_NODE:  # also a LIMITS row; kept for records from the store
            raise InvalidArgument(f"node {n.id!r} has {n.gpus} GPUs; at most {MAX_GPUS_PER_NODE}")
    for pool, count in reg.pool_spares.items():
        if not 0 <= count <= len(reg.nodes):
            raise InvalidArgument(f"Register.pool_spares: pool {pool!r} reserves {count} spare"
                                  f" nodes; 0 to the agent's {len(reg.nodes)} nodes")
    for root in reg.checkpoint_roots:
        try:
            canonical(root)
        except RootError as e:
            raise InvalidArgument(f"Register.checkpoint_roots: {e}") from e


def checkpoint_roots_of(config_roots: Iterable[str], checkpoint_root: str,
                        agents: Iterable[apb.Register]) -> list[str]:
    """Where a job may choose to write checkpoints: the operator's broker-wide roots,
    the broker's default root, and every region's advertised store and roots."""
    roots = [*config_roots, os.path.abspath(checkpoint_root)]
    for a in agents:
        if a.checkpoint_bucket and (a.checkpoint_bucket.startswith(("s3://", "file://", "/"))):
            roots.append(a.checkpoint_bucket)
        roots.extend(a.checkpoint_roots)
    return roots
