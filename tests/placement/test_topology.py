"""Topology rules: gangs stay inside one agent, `required` is a hard limit, `preferred`
is met when possible, otherwise the tightest domain; best fit keeps big blocks whole."""

from __future__ import annotations

from placement import TopologyLevel, schedule
from placement.model import RunningJob

from .helpers import admitted, block_cluster, job, node, snap, ultraservers


def blocks_of(d, nodes):
    by_id = {n.id: n for n in nodes}
    return {a.job_id: {by_id[n].layer3 for n, _ in a.assignments} for a in d.admissions}


def test_required_layer3_never_split_and_reason_names_largest_block():
    nodes = block_cluster({"b0": 3, "b1": 3})
    d = schedule(snap(nodes, [job("big", nodes=4, required=TopologyLevel.LAYER_3)]))
    assert d.admissions == []
    reason = d.pending_reasons["big"]
    assert "needs 32 GPUs (4 node(s) x 8) within one layer-3 block" in reason
    assert "largest free block is 24 GPUs in r1/z1/l1/l2/b0" in reason


def test_without_required_a_gang_may_span_blocks_but_not_agents():
    nodes = block_cluster({"b0": 3, "b1": 3}, agent="a1") + block_cluster({"c0": 2}, agent="a2")
    d = schedule(snap(nodes, [job("g", nodes=6), job("h", nodes=3)]))
    adm = {a.job_id: a for a in d.admissions}
    assert adm["g"].agent_id == "a1" and len(adm["g"].assignments) == 6
    # 3 nodes: a1 is full, a2 has only 2 -> never split across agents
    assert "h" in d.pending_reasons


def test_tightest_domain_and_best_fit_block():
    # b0 has 4 free nodes, b1 has 2: a 2-node gang goes to b1 (best fit), keeping b0 whole.
    nodes = block_cluster({"b0": 4, "b1": 2})
    d = schedule(snap(nodes, [job("two", nodes=2)]))
    assert blocks_of(d, nodes)["two"] == {"b1"}
    d = schedule(snap(nodes, [job("four", nodes=4)]))
    assert blocks_of(d, nodes)["four"] == {"b0"}


def test_preferred_met_when_feasible_else_tightest():
    nodes = block_cluster({"b0": 2, "b1": 2, "b2": 3})
    d = schedule(snap(nodes, [job("p", nodes=3, preferred=TopologyLevel.LAYER_3)]))
    assert blocks_of(d, nodes)["p"] == {"b2"}
    # 4 nodes fit no single block: placed anyway, spanning as few blocks as possible (2).
    d = schedule(snap(nodes, [job("q", nodes=4, preferred=TopologyLevel.LAYER_3)]))
    assert len(blocks_of(d, nodes)["q"]) == 2


def test_single_node_jobs_pack_partly_used_nodes_first():
    nodes = block_cluster({"b0": 2})
    running = [RunningJob(id="r", team="t", priority=70, allocations=((nodes[1].id, 6),))]
    d = schedule(snap(nodes, [job("small", gpus=2)], running=running))
    assert admitted(d)["small"] == ((nodes[1].id, 2),)


def test_small_jobs_keep_ultraservers_whole():
    us = ultraservers(2)
    d = schedule(snap(us, [job(f"s{i}", gpus=4, accelerator="gb200") for i in range(18)]
                      + [job("nv", nodes=18, gpus=4, accelerator="gb200", required=TopologyLevel.ULTRASERVER)]))
    # 18 single-node jobs fill one UltraServer, so the 72-GPU NVLink job still fits the other
    by_id = {n.id: n for n in us}
    adm = admitted(d)
    assert len(adm) == 19
    assert len({by_id[n].ultraserver for n, _ in adm["nv"]}) == 1


def test_small_jobs_after_gang_fill_one_ultraserver_not_both():
    us = ultraservers(2)
    smalls = [job(f"s{i}", gpus=2, accelerator="gb200") for i in range(4)]
    d = schedule(snap(us, smalls))
    by_id = {n.id: n for n in us}
    used = {by_id[n].ultraserver for a in d.admissions for n, _ in a.assignments}
    assert len(used) == 1
    # so a later 72-GPU job still fits
    later = schedule(snap(us, [job("nv", nodes=18, gpus=4, accelerator="gb200", required=TopologyLevel.ULTRASERVER)],
                          running=[RunningJob(id=a.job_id, team="t", priority=70, allocations=a.assignments)
                                   for a in d.admissions]))
    assert "nv" in admitted(later)


def test_unlabelled_nodes_host_single_node_jobs_but_no_required_gangs():
    nodes = [node(i) for i in range(4)]
    d = schedule(snap(nodes, [job("one", required=TopologyLevel.LAYER_3),
                              job("gang", nodes=2, required=TopologyLevel.LAYER_3),
                              job("free", nodes=2)]))
    adm = admitted(d)
    assert "one" in adm and "free" in adm and "gang" in d.pending_reasons
