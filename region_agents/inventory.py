"""Load a region inventory file (docs/contracts.md section 4) into ``Node`` messages.

Why validate hard here: the inventory is what the broker places gangs on. A typo
(``gpu: 8``), an unknown capacity type or two nodes with the same name would
silently skew every placement, so each problem becomes a clear error naming the
file and line. Every node goes through :mod:`region_agents.labels`, the same
mapping Kubernetes ``Node`` objects use.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from computebroker.v1 import common_pb2
from region_agents import labels as L

_COMMON_KEYS = {
    "instance_type",
    "accelerator",
    "gpus",
    "efa",
    "capacity_type",
    "price_per_gpu_hour",
    "pool",
    "training_plan",
    "interruption_risk",
    "healthy",
    "cordoned",
    "zone",
    "labels",
}
_GROUP_KEYS = _COMMON_KEYS | {"name_prefix", "count", "start_index", "spares"}
_NODE_KEYS = _COMMON_KEYS | {"name"}
_TOP_KEYS = {"region", "agent_id", "checkpoint_bucket", "node_groups", "nodes"}


class InventoryError(ValueError):
    """The inventory file is invalid; the message names the file and line."""


@dataclass
class Inventory:
    """A region's simulated (or discovered) cluster."""

    region: str
    agent_id: str
    checkpoint_bucket: str = ""
    nodes: list[common_pb2.Node] = field(default_factory=list)
    # Spare nodes reserved per pool (a node group's `spares: N`, summed per pool): the
    # broker keeps that many free nodes of the pool for in-place replacement of lost
    # nodes (Register.pool_spares, docs/recovery.md).
    spares: dict[str, int] = field(default_factory=dict)

    def pool_spares(self) -> dict[str, int]:
        """Spares per pool to register (``Register.pool_spares``): per pool, the node
        groups' ``spares: N`` or the nodes the operator labelled spares
        (``computebroker.io/spare=true``, ``Node.spare``: on Kubernetes the Node's own
        label), whichever is more. Why the larger and not the sum: a label names *which*
        nodes are the pool's spares, a count only how many; a pool given both keeps its
        labelled nodes first (the broker's choice, broker/scheduling/spares.py) and
        tops up to the count with other free nodes."""
        labelled: dict[str, int] = {}
        for n in self.nodes:
            if n.spare:
                labelled[n.pool] = labelled.get(n.pool, 0) + 1
        pools = set(self.spares) | set(labelled)
        return {p: max(self.spares.get(p, 0), labelled.get(p, 0)) for p in sorted(pools)}

    def node(self, node_id: str) -> common_pb2.Node | None:
        return next((n for n in self.nodes if n.id == node_id), None)


class _LineDict(dict):
    """A mapping that remembers the 1-based line it started on (for error messages)."""

    line: int = 0


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _LineDict:
    out = _LineDict(loader.construct_mapping(node, deep=True))
    out.line = node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory file (YAML or JSON)."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InventoryError(f"{path}: cannot read inventory file: {e.strerror}") from None
    return parse_inventory(text, source=path)


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    """Parse inventory text; ``source`` is used in error messages."""
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise InventoryError(f"{where}: not valid YAML/JSON: {e}") from None
    if not isinstance(data, dict):
        raise InventoryError(f"{source}: top level must be a mapping with region and node_groups/nodes")

    def err(obj: Any, msg: str) -> InventoryError:
        line = getattr(obj, "line", 0)
        return InventoryError(f"{source}:{line}: {msg}" if line else f"{source}: {msg}")

    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise err(data, f"unknown top-level key(s) {unknown}; expected {sorted(_TOP_KEYS)}")
    region = data.get("region")
    if not region or not isinstance(region, str):
        raise err(data, "'region' is required (e.g. region: us-east-2)")
    agent_id = str(data.get("agent_id") or f"{region}-agent")
    inv = Inventory(
        region=region, agent_id=agent_id, checkpoint_bucket=str(data.get("checkpoint_bucket") or "")
    )
    seen: dict[str, int] = {}

    def add(name: str, entry: Any) -> None:
        line = getattr(entry, "line", 0)
        if name in seen:
            raise err(entry, f"duplicate node name {name!r} (first defined at line {seen[name]})")
        seen[name] = line
        inv.nodes.append(_node(name, entry, region, err))

    for g in _entries(data, "node_groups", _GROUP_KEYS, "node group", err):
        prefix = g.get("name_prefix")
        if not prefix:
            raise err(g, "node group needs 'name_prefix'")
        count = g.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise err(g, f"node group {prefix!r}: 'count' must be a positive integer, got {count!r}")
        start = int(g.get("start_index", 0))
        for i in range(start, start + count):
            add(f"{prefix}-{i:03d}", g)
        spares = g.get("spares", 0)
        if not isinstance(spares, int) or isinstance(spares, bool) or not 0 <= spares < count:
            raise err(g, f"node group {prefix!r}: 'spares' must be an integer from 0 to"
                         f" count - 1 ({count - 1}), got {spares!r}")
        if spares:
            pool = inv.nodes[-1].pool
            inv.spares[pool] = inv.spares.get(pool, 0) + spares
    for n in _entries(data, "nodes", _NODE_KEYS, "node", err):
        if not n.get("name"):
            raise err(n, "node needs 'name'")
        add(str(n["name"]), n)
    if not inv.nodes:
        raise err(data, "inventory has no nodes (add node_groups or nodes)")
    return inv


def _entries(data: dict, key: str, allowed: set[str], what: str, err: Any) -> Iterator[dict]:
    """The mappings listed under ``key``, each checked for unknown keys as it is reached."""
    entries = data.get(key) or []
    if not isinstance(entries, list):
        raise err(data, f"'{key}' must be a list")
    for entry in entries:
        if not isinstance(entry, dict):
            raise err(data, f"each {key} entry must be a mapping")
        _check_keys(entry, allowed, what, err)
        yield entry


def _check_keys(entry: dict, allowed: set[str], what: str, err: Any) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise err(entry, f"unknown {what} key(s) {unknown}; allowed: {sorted(allowed)}")


def _node(name: str, e: dict, region: str, err: Any) -> common_pb2.Node:
    """One node: the entry's fields become our labels, then labels.py maps them."""
    gpus = e.get("gpus")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus <= 0:
        raise err(e, f"node {name!r}: 'gpus' must be a positive integer, got {gpus!r}")
    efa = e.get("efa", 0)
    if not isinstance(efa, int) or efa < 0:
        raise err(e, f"node {name!r}: 'efa' must be a non-negative integer, got {efa!r}")
    raw_labels = e.get("labels") or {}
    if not isinstance(raw_labels, dict):
        raise err(e, f"node {name!r}: 'labels' must be a mapping")
    labels = {str(k): str(v) for k, v in raw_labels.items()}
    labels.setdefault(L.LABEL_REGION, region)
    for key, label in (
        ("instance_type", L.LABEL_INSTANCE_TYPE),
        ("accelerator", L.LABEL_ACCELERATOR),
        ("pool", L.LABEL_POOL),
        ("training_plan", L.LABEL_PLAN),
        ("zone", L.LABEL_ZONE),
    ):
        if e.get(key) not in (None, ""):
            labels[label] = str(e[key])
    if e.get("capacity_type") not in (None, ""):
        try:
            L.parse_capacity_type(str(e["capacity_type"]))
        except L.LabelError as x:
            raise err(e, f"node {name!r}: {x}") from None
        labels[L.LABEL_CAPACITY] = str(e["capacity_type"])
    for key, label in (
        ("price_per_gpu_hour", L.LABEL_PRICE),
        ("interruption_risk", L.LABEL_INTERRUPTION_RISK),
    ):
        if e.get(key) is not None:
            try:
                value = float(e[key])
            except (TypeError, ValueError):
                raise err(e, f"node {name!r}: {key!r} must be a number, got {e[key]!r}") from None
            if value < 0:
                raise err(e, f"node {name!r}: {key!r} must be >= 0, got {value}")
            labels[label] = repr(value)
    if labels[L.LABEL_REGION] != region:
        raise err(e, f"node {name!r}: region label {labels[L.LABEL_REGION]!r} != inventory region {region!r}")
    try:
        return L.node_from_labels(
            name,
            labels,
            gpus,
            efa=efa,
            healthy=bool(e.get("healthy", True)),
            cordoned=bool(e.get("cordoned", False)),
            region=region,
        )
    except L.LabelError as x:
        raise err(e, f"node {name!r}: {x}") from None
