"""inventory.py: the region inventory file (docs/contracts.md section 4)."""

from __future__ import annotations

import json

import pytest

from computebroker.v1 import common_pb2
from region_agents.inventory import InventoryError, load_inventory, parse_inventory

CT = common_pb2.CapacityType


def test_contract_example_loads(inventory_file):
    inv = load_inventory(inventory_file)
    assert inv.region == "test-1" and inv.agent_id == "test-1-a"
    assert [n.id for n in inv.nodes] == ["t1-p5-000", "t1-p5-001", "t1-spot-000"]
    p5 = inv.nodes[0]
    assert p5.gpus == 8 and p5.efa == 32 and p5.instance_type == "p5.48xlarge"
    assert p5.accelerator == "h100" and p5.zone == "t1-az1" and p5.region == "test-1"
    assert p5.network_layer_3 == "l3-a" and p5.capacity_type == CT.CAPACITY_TYPE_ON_DEMAND
    assert p5.price_per_gpu_hour == pytest.approx(4.1)
    spot = inv.node("t1-spot-000")
    assert spot.capacity_type == CT.CAPACITY_TYPE_SPOT and spot.gpus == 4 and spot.pool == "spot"


def test_nodes_one_by_one_and_json(tmp_path):
    doc = {"region": "r", "checkpoint_bucket": "s3://b",
           "nodes": [{"name": "a", "gpus": 4, "capacity_type": "training_plan",
                      "training_plan": "tp-1", "healthy": False},
                     {"name": "b", "gpus": 2, "labels": {"topology.k8s.aws/ultraserver-id": "u1"}}]}
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(doc))
    inv = load_inventory(path)
    assert inv.agent_id == "r-agent" and inv.checkpoint_bucket == "s3://b"
    a, b = inv.nodes
    assert a.capacity_type == CT.CAPACITY_TYPE_TRAINING_PLAN and a.pool == "tp-1" and not a.healthy
    assert b.ultraserver_id == "u1" and b.healthy


@pytest.mark.parametrize(
    "text,match",
    [
        ("region: r\nnodes:\n  - name: a\n    gpus: 8\n    capacity_type: cheap\n",
         r"inv.yaml:3: node 'a': unknown capacity type 'cheap'"),
        ("region: r\nnodes:\n  - name: a\n    gpus: 0\n", r"inv.yaml:3: node 'a': 'gpus' must be a positive"),
        ("region: r\nnodes:\n  - name: a\n    gpus: 1\n  - name: a\n    gpus: 2\n",
         r"inv.yaml:5: duplicate node name 'a' \(first defined at line 3\)"),
        ("region: r\nnode_groups:\n  - name_prefix: g\n    count: 2\n    gpus: 1\n"
         "nodes:\n  - name: g-001\n    gpus: 1\n", r"duplicate node name 'g-001'"),
        ("region: r\nnodes:\n  - name: a\n    gpu: 8\n", r"inv.yaml:3: unknown node key\(s\) \['gpu'\]"),
        ("nodes: []\n", r"'region' is required"),
        ("region: r\n", r"no nodes"),
        ("region: r\nnode_groups:\n  - name_prefix: g\n    count: -1\n    gpus: 1\n", r"'count' must be"),
        ("region: r\nnodes: [ {name: a\n", r"inv.yaml:\d+: not valid YAML"),
        ("region: r\nnodes:\n  - name: a\n    gpus: 1\n    price_per_gpu_hour: lots\n", r"must be a number"),
        ("region: r\nnodes:\n  - name: a\n    gpus: 1\n    labels: {topology.kubernetes.io/region: other}\n",
         r"region label 'other' != inventory region 'r'"),
    ],
)
def test_errors_name_file_and_line(text, match):
    with pytest.raises(InventoryError, match=match):
        parse_inventory(text, source="inv.yaml")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(InventoryError, match="cannot read inventory file"):
        load_inventory(tmp_path / "nope.yaml")


def test_spares_per_pool_add_up_and_are_checked():
    text = """
region: r
node_groups:
  - {name_prefix: a, count: 4, gpus: 8, pool: p5, spares: 1}
  - {name_prefix: b, count: 2, gpus: 8, pool: p5, spares: 1}
  - {name_prefix: c, count: 2, gpus: 8}
"""
    inv = parse_inventory(text)
    assert inv.spares == {"p5": 2}  # the pool's groups add up; no `spares`, none
    for bad in ("spares: 4", "spares: -1", "spares: one", "spares: true"):
        with pytest.raises(InventoryError, match=r"<inventory>:4: .*'spares' must be an integer from 0 to"):
            parse_inventory(text.replace("spares: 1}", bad + "}", 1))


def test_labelled_spares_count_per_pool_and_the_larger_count_wins():
    """An operator's labelled spares (computebroker.io/spare=true: a Kubernetes Node's
    label, or a node's `labels` here) register as the pool's spares; a pool with a
    `spares: N` count and labels gets the larger number (labels say which, counts how
    many). Any value but "true" is no spare."""
    from computebroker.v1 import common_pb2
    from region_agents import labels as L
    from region_agents.inventory import Inventory

    text = """
region: r
node_groups:
  - {name_prefix: a, count: 4, gpus: 8, pool: p5, spares: 1}
nodes:
  - {name: x1, gpus: 8, pool: p4, labels: {computebroker.io/spare: "true"}}
  - {name: x2, gpus: 8, pool: p4, labels: {computebroker.io/spare: "True"}}
  - {name: x3, gpus: 8, pool: p4, labels: {computebroker.io/spare: "no"}}
  - {name: y1, gpus: 8, pool: p5, labels: {computebroker.io/spare: "true"}}
"""
    inv = parse_inventory(text)
    assert [n.id for n in inv.nodes if n.spare] == ["x1", "x2", "y1"]
    assert inv.pool_spares() == {"p4": 2, "p5": 1}
    inv.spares["p5"] = 3
    assert inv.pool_spares() == {"p4": 2, "p5": 3}
    k8s_node = {"metadata": {"name": "n1", "labels": {L.LABEL_SPARE: "true", L.LABEL_POOL: "gpu"}},
                "status": {"allocatable": {L.RESOURCE_GPU: "8"}}}
    node = L.node_from_k8s(k8s_node)
    assert node.spare and node.pool == "gpu"
    assert Inventory(region="r", agent_id="a", nodes=[node, common_pb2.Node(id="n2", pool="gpu")]
                     ).pool_spares() == {"gpu": 1}


def test_the_resume_report_is_forwarded():
    """The trainer's resume report (docs/contracts.md section 2) reaches Progress.resume;
    junk in it is dropped, never an error."""
    from region_agents.progress import parse_progress

    snap = parse_progress({"step": 15, "resume_tier": "memory", "resumed_step": 14,
                           "restored_from_peer": [1, "x", True, -2, 3]})
    assert snap is not None
    r = snap.progress.resume
    assert (r.tier, r.step, list(r.restored_from_peer)) == ("memory", 14, [1, 3])
    # a shrink in place: the world sizes travel too (bad values are 0 = not reported)
    shrunk = parse_progress({"step": 15, "resume_tier": "memory", "resumed_step": 14,
                             "resumed_from_world_size": 3, "world_size": 2})
    assert shrunk is not None
    assert (shrunk.progress.resumed_from_world_size, shrunk.progress.world_size) == (3, 2)
    bad = parse_progress({"step": 1, "resume_tier": "memory", "resumed_from_world_size": "x",
                          "world_size": -4})
    assert bad is not None
    assert (bad.progress.resumed_from_world_size, bad.progress.world_size) == (0, 0)
    store = parse_progress({"step": 10, "resume_tier": "store"})
    assert store is not None and store.progress.resume.tier == "store"
    for other in ({"step": 3}, {"step": 3, "resume_tier": "tape"}):
        got = parse_progress(other)
        assert got is not None and not got.progress.HasField("resume")
