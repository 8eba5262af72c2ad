"""Limits on every field a caller or an agent can send: one table, as data.

Why a table: a limit written as an ``if`` in each servicer is a limit someone forgets
for the next field (issue 12: 10 MB labels, NaN prices, capacity_type=99 and 2^31-1
GPU nodes all came in through fields nobody had checked). Here every string, bytes,
repeated, map, number and enum field of every request message is covered by a rule;
fields without their own row get the defaults. ``broker/api/edge.py`` applies the
table to each decoded message (both directions: user RPCs and agent stream messages)
through ``broker/api/validation.py:check_message``; docs/contracts.md "Limits" is the
human copy of it.

Keys: a field's name (``"team"``) applies in every message; ``"Message.field"``
(``"Node.gpus"``) overrides it for one message type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from broker.jobs.budgets import MAX_NODE_FAILURE_WINDOW_S, MAX_NODE_FAILURES

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Counters the broker sums into int32 proto fields (RegionInfo.total_gpus etc.) stay far
# below INT32_MAX with these caps: 10_000 nodes x 1024 GPUs = 10.2 M per agent.
MAX_GPUS_PER_NODE = 1024
MAX_NODES_PER_AGENT = 10_000
MAX_GPU_COUNT = 10_000_000  # quotas, plan sizes: any GPU total a request may name
MAX_PRICE = 1_000_000.0  # $/GPU-hour; far above any real price, far below float trouble
MAX_PRIORITY = 1_000_000_000  # |PriorityClass.value|
MAX_EPOCH_S = 2.0**33  # epoch seconds (year 2242): every platform's gmtime can print it
MAX_STEPS = 2**53  # exact in a float (progress ratios) and in every store

# gRPC message size: the largest request the broker decodes (workdir chunks are 1 MiB).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Spec files brokerctl reads (YAML/JSON): refused before parsing above this.
MAX_SPEC_FILE_BYTES = 1024 * 1024


class Kind(enum.Enum):
    """What a string field holds, i.e. which characters it may contain."""

    IDENTIFIER = "identifier"  # names, ids, regions, label keys/values: no control chars
    TEXT = "text"  # free text (reasons, messages, env values, argv): any char, escaped on output


@dataclass(frozen=True)
class FieldLimit:
    """Limits of one field. ``max_len``: characters (strings) or bytes (bytes fields);
    ``max_items``: entries of a repeated or map field; ``lo``/``hi``: numeric range."""

    max_len: int | None = None
    kind: Kind | None = None
    max_items: int | None = None
    lo: float | None = None
    hi: float | None = None
    finite: bool = True  # False: NaN/inf are facts worth keeping (a diverged loss)


DEFAULT_STRING = FieldLimit(max_len=1024, kind=Kind.IDENTIFIER)
DEFAULT_ITEMS = 10_000
DEFAULT_BYTES = MAX_MESSAGE_BYTES

ID = FieldLimit(max_len=253, kind=Kind.IDENTIFIER)  # a DNS name (Kubernetes node names)
NAME = FieldLimit(max_len=200, kind=Kind.IDENTIFIER)
URI = FieldLimit(max_len=2048, kind=Kind.IDENTIFIER)
REASON = FieldLimit(max_len=4096, kind=Kind.TEXT)
REGIONS = FieldLimit(max_len=253, kind=Kind.IDENTIFIER, max_items=256)

LIMITS: dict[str, FieldLimit] = {
    # ---- identifiers ------------------------------------------------------------------
    "job_id": ID, "agent_id": ID, "node_id": ID, "plan_id": ID, "command_id": ID,
    "client_request_id": FieldLimit(max_len=200, kind=Kind.IDENTIFIER),
    "id": ID, "region": ID, "zone": ID, "instance_type": ID, "accelerator": ID, "pool": ID,
    "network_layer_1": ID, "network_layer_2": ID, "network_layer_3": ID, "ultraserver_id": ID,
    "team": FieldLimit(max_len=63, kind=Kind.IDENTIFIER), "cohort": ID,
    "priority_class": ID, "dataset_region": ID, "executor": ID, "version": ID,
    "digest": FieldLimit(max_len=80, kind=Kind.IDENTIFIER),
    "stream": FieldLimit(max_len=16, kind=Kind.IDENTIFIER),
    "page_token": FieldLimit(max_len=512, kind=Kind.IDENTIFIER),
    "name": NAME, "model": NAME, "image": URI,
    "allowed_regions": REGIONS, "denied_regions": REGIONS, "preferred_regions": REGIONS,
    # ---- URIs ------------------------------------------------------------------------
    "checkpoint_uri": URI, "dataset_uri": URI, "checkpoint_bucket": URI,
    "last_checkpoint_uri": URI, "src_uri": URI, "dst_uri": URI,
    "resume_from": URI, "ResumeSource.uri": URI, "ResumeSource.prefix": URI,
    "checkpoint_roots": FieldLimit(max_len=2048, kind=Kind.IDENTIFIER, max_items=64),
    # ---- free text -------------------------------------------------------------------
    "reason": REASON, "error": REASON, "checkpoint_store_error": REASON, "method": ID,
    "message": REASON,
    "JobUpdate.message": FieldLimit(max_len=64 * 1024, kind=Kind.TEXT),  # a stderr tail
    # Arguments: text; their control characters (NUL included) are refused by the
    # submit checks (broker/workdirs/checks.py), which allow newlines and tabs.
    "command": FieldLimit(max_len=32 * 1024, kind=Kind.TEXT, max_items=4096),
    # ---- maps: key and value rows are "<map>.key" / "<map>.value" ----------------------
    "labels": FieldLimit(max_items=64),
    "Node.labels": FieldLimit(max_items=256),  # every Kubernetes node label is copied
    # Kubernetes' own bound: a 253-char DNS prefix, '/', a 63-char name.
    "labels.key": FieldLimit(max_len=320, kind=Kind.IDENTIFIER),
    "labels.value": FieldLimit(max_len=1024, kind=Kind.IDENTIFIER),
    "env": FieldLimit(max_items=128),
    "env.key": FieldLimit(max_len=256, kind=Kind.IDENTIFIER),
    "env.value": FieldLimit(max_len=32 * 1024, kind=Kind.TEXT),
    "options": FieldLimit(max_items=64),
    "options.key": FieldLimit(max_len=128, kind=Kind.IDENTIFIER),
    "options.value": FieldLimit(max_len=4096, kind=Kind.TEXT),
    "region_caps": FieldLimit(max_items=256),
    "region_caps.key": ID,
    "region_caps.value": FieldLimit(lo=0, hi=MAX_GPU_COUNT),
    # when something began (a store outage, a node failure, an audit window): printed with
    # gmtime, which overflows past time_t (an agent's since=1e300 raised in the update path)
    "since": FieldLimit(lo=0, hi=MAX_EPOCH_S),
    "pool_spares": FieldLimit(max_items=1024),
    "pool_spares.key": ID,
    "pool_spares.value": FieldLimit(lo=0, hi=MAX_NODES_PER_AGENT),
    "restored_from_peer": FieldLimit(max_items=100_000, lo=0, hi=INT32_MAX),
    "resumed_from_world_size": FieldLimit(lo=0, hi=INT32_MAX),
    "Progress.world_size": FieldLimit(lo=0, hi=INT32_MAX),
    "tier": FieldLimit(max_len=16, kind=Kind.IDENTIFIER),
    # ---- repeated counts -------------------------------------------------------------
    "capacity_types": FieldLimit(max_items=8), "phases": FieldLimit(max_items=16),
    "quotas": FieldLimit(max_items=256),
    "Register.nodes": FieldLimit(max_items=MAX_NODES_PER_AGENT),
    # Rank output: one line up to 1 MiB (the message size caps the chunk).
    "lines": FieldLimit(max_len=1024 * 1024, kind=Kind.TEXT, max_items=100_000),
    "sizes": FieldLimit(max_items=100_000, lo=0, hi=INT32_MAX),
    "data": FieldLimit(max_len=MAX_MESSAGE_BYTES),
    # ---- numbers: what the scheduler sums, prices, ratios ------------------------------
    "Node.gpus": FieldLimit(lo=0, hi=MAX_GPUS_PER_NODE),
    "Node.efa": FieldLimit(lo=0, hi=1024),
    "Node.price_per_gpu_hour": FieldLimit(lo=0, hi=MAX_PRICE),
    "Node.interruption_risk": FieldLimit(lo=0, hi=1),
    "TrainingPlan.price_per_gpu_hour": FieldLimit(lo=0, hi=MAX_PRICE),
    "TrainingPlan.instance_count": FieldLimit(lo=0, hi=MAX_NODES_PER_AGENT),
    "TrainingPlan.gpus_per_instance": FieldLimit(lo=0, hi=MAX_GPUS_PER_NODE),
    "max_price_per_gpu_hour": FieldLimit(lo=0, hi=MAX_PRICE),
    "guaranteed_gpus": FieldLimit(lo=0, hi=MAX_GPU_COUNT),
    "borrow_limit_gpus": FieldLimit(lo=0, hi=MAX_GPU_COUNT),
    "lend_limit_gpus": FieldLimit(lo=0, hi=MAX_GPU_COUNT),
    "fair_share_weight": FieldLimit(lo=0, hi=1e6),
    # Priority classes: Kueue's WorkloadPriorityClass range is int32; a billion either way
    # leaves room to sum or offset without overflow.
    "PriorityClass.value": FieldLimit(lo=-MAX_PRIORITY, hi=MAX_PRIORITY),
    "PriorityClass.name": FieldLimit(max_len=63, kind=Kind.IDENTIFIER),
    "PriorityClass.description": FieldLimit(max_len=1024, kind=Kind.TEXT),
    "DeletePriorityClassRequest.name": FieldLimit(max_len=63, kind=Kind.IDENTIFIER),
    "TrainerSpec.total_steps": FieldLimit(lo=0, hi=MAX_STEPS),
    "TrainerSpec.checkpoint_every": FieldLimit(lo=0, hi=MAX_STEPS),
    "step_sleep_s": FieldLimit(lo=0, hi=86_400),
    "expected_duration_s": FieldLimit(lo=0, hi=1e9),
    # restart budgets (broker/jobs/budgets.py; its MAX_* are these bounds)
    "JobSpec.max_node_failures": FieldLimit(lo=0, hi=MAX_NODE_FAILURES),
    "JobSpec.node_failure_window_s": FieldLimit(lo=0, hi=MAX_NODE_FAILURE_WINDOW_S),
    "ttl_s": FieldLimit(lo=0, hi=10 * 366 * 86_400),  # token lifetimes; the broker's max is lower
    # Measurements an agent reports, never used in sums or comparisons: a training run
    # whose loss diverged to NaN must still have its updates applied.
    "Progress.loss": FieldLimit(finite=False),
    "Progress.tokens_per_s": FieldLimit(finite=False),
    "TransferStats.mb_per_s": FieldLimit(finite=False),
}

# Every double/float field must be finite (NaN passes every ``< 0`` check; inf sums
# poison every total); this is not a row but a rule of check_message.
