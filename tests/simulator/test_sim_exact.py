"""Hand-computed scenarios: every JCT below is derived in the comment above it.

Model (scenario in helpers.scenario): scheduler passes on a 10 s grid; a launch takes
process start 10 s + checkpoint read (bytes / 1 GB/s, only when resuming) + transfer
(bytes / inter-region GB/s, only when the checkpoint is in another region); a stop with
checkpoint takes bytes / 1 GB/s; periodic checkpoints every 300 s of running.
"""

from __future__ import annotations

from broker.jobs.causes import Cause
from simulator.policies import PolicyKind
from tests.simulator.helpers import jct, scenario, simulate


def test_single_job_runs_launch_plus_duration(tmp_path):
    # admitted at the t=0 pass, RUNNING at 10 (process start), done at 10 + 1000
    sim = simulate(tmp_path, scenario(), [("a", 0, 1000, 8, "t")])
    assert jct(sim, "a") == 1010
    assert sim.sj["a"].job.goodput.productive_s == 1000
    assert sim.sj["a"].job.goodput.queued_s == 10


def test_drain_migrates_with_checkpoint_and_transfer(tmp_path):
    # Two regions of one 8-GPU node; the job prefers r1 (its team's home).
    # 0: admitted in r1; 10: RUNNING. 500: r1 drains -> checkpoint of 8 GB at 1 GB/s,
    # done at 508 with 490 s of work saved. Next pass on the grid: 510, placed in r2.
    # Start-up 10 + read 8 + transfer 8 = 26 -> RUNNING at 536; 510 s left -> done 1046.
    scn = scenario(regions=[
        {"name": "r1", "pools": [{"kind": "on_demand", "nodes": 1, "price_per_gpu_hour": 2.0}]},
        {"name": "r2", "pools": [{"kind": "on_demand", "nodes": 1, "price_per_gpu_hour": 2.0}]}],
        drains=[{"region": "r1", "start_s": 500, "end_s": 100000}])
    sim = simulate(tmp_path, scn, [("a", 0, 1000, 8, "t")])
    j = sim.sj["a"]
    assert jct(sim, "a") == 1046
    assert j.migrations == 1 and j.job.placement.region == "r2"
    # nothing redone: lost = 8 s checkpointing + 26 s start-up, x 8 GPUs
    assert j.lost == {Cause.REGION_DRAIN.value: (8 + 26) * 8, "launch": 10 * 8}
    g = j.job.goodput
    assert g.productive_s == 1000 and g.lost_migration_s == 8 + 2 + 26


def _spot_scn() -> dict:
    # one spot node (cheapest, chosen first) and one on-demand node; 20 GB of state per
    # GPU: the 160 GB save cannot finish inside the 110 s the 2-minute notice leaves
    return scenario(
        checkpoint={"bytes_per_gpu": 20e9, "interval_s": 300, "write_gbps": 1.0, "read_gbps": 1.0,
                    "process_start_s": 10},
        regions=[{"name": "r1", "pools": [
            {"kind": "on_demand", "nodes": 1, "price_per_gpu_hour": 3.0},
            {"kind": "spot", "nodes": 1, "price_per_gpu_hour": 1.0}]}],
        reclaims=[{"region": "r1", "start_s": 500, "end_s": 100000}])


def test_spot_loss_without_checkpoint_goes_back_to_the_periodic_one(tmp_path):
    # ours: 0 admitted on spot; RUNNING 10; periodic checkpoint at 310 (300 s of work).
    # 500: notice, save started, grace 110 s < 160 s write -> at 610 the save failed:
    # back to 300 s of work. Pass at 610: on-demand node. Start-up 10 + read 160 = 170
    # -> RUNNING 780; 700 s left -> done at 1480.
    sim = simulate(tmp_path, _spot_scn(), [("a", 0, 1000, 8, "t")])
    j = sim.sj["a"]
    assert jct(sim, "a") == 1480
    assert j.job.placement.capacity_type == 1  # on-demand
    # redone 190 s (310..500) + 110 s of failed save + 170 s start-up, x 8 GPUs
    assert j.lost == {Cause.SPOT_INTERRUPTION.value: (190 + 110 + 170) * 8, "launch": 80}


def test_failover_kills_at_the_notice_and_restarts_at_once(tmp_path):
    # skypilot-failover: no save; at 500 the attempt is stopped, back to 300 s of work,
    # placed at the 500 pass on the on-demand node; RUNNING at 500 + 170 = 670; done 1370.
    sim = simulate(tmp_path, _spot_scn(), [("a", 0, 1000, 8, "t")], policy=PolicyKind.FAILOVER)
    assert jct(sim, "a") == 1370
    assert sim.sj["a"].lost[Cause.SPOT_INTERRUPTION.value] == (190 + 170) * 8


def _defrag_case(tmp_path, policy: PolicyKind):
    # Three 8-GPU nodes; layer-3 blocks of 2 nodes: {n0, n1} and {n2}. Two 4-GPU jobs
    # s1, s2 (10000 s) are best-fit onto n0; the 2x8 gang g arrives at 100 and needs one
    # layer-3 block: n0 is half full, n2's block has one node.
    scn = scenario(regions=[{"name": "r1", "layer3_nodes": 2, "ultraserver_nodes": 2, "pools": [
        {"kind": "on_demand", "nodes": 3, "price_per_gpu_hour": 2.0}]}],
        checkpoint={"bytes_per_gpu": 1e9, "interval_s": 300, "write_gbps": 1.0, "read_gbps": 1.0,
                    "process_start_s": 10})
    rows = [("s1", 0, 10000, 4, "t"), ("s2", 0, 10000, 4, "t"), ("g", 100, 1000, 16, "t")]
    return simulate(tmp_path, scn, rows, policy=policy)


def test_defragmentation_moves_small_jobs_for_the_gang(tmp_path):
    # ours (it defragments): at the 100 pass g cannot place; gain 16 GPUs x 9910 s left >> cost;
    # s1, s2 save 4 GB each (done 104) and leave block {n0, n1}. Pass at 110: s1, s2 -> n2,
    # g -> n0+n1 (one UltraServer, full speed): RUNNING 120, done 1120 -> JCT 1020.
    # s1/s2: 90 s saved; start-up 10 + read 4 -> RUNNING 124, 9910 s left -> done 10034.
    sim = _defrag_case(tmp_path, PolicyKind.OURS)
    assert {a.node_id for a in sim.sj["s1"].job.placement.nodes} == {"r1-n0002"}
    assert jct(sim, "g") == 1020
    assert jct(sim, "s1") == 10034 and jct(sim, "s2") == 10034
    assert sim.sj["s1"].migrations == 1 and sim.sj["g"].migrations == 0
    assert sim.sj["s1"].lost == {Cause.DEFRAGMENT.value: (4 + 14) * 4, "launch": 40}


def test_without_defragmentation_the_gang_waits_for_the_small_jobs(tmp_path):
    # ours-no-defrag: s1, s2 RUNNING 10..10010; the pass at 10010 places g: RUNNING 10020, done 11020.
    sim = _defrag_case(tmp_path, PolicyKind.NO_DEFRAG)
    assert jct(sim, "g") == 10920
    assert jct(sim, "s1") == 10010


def test_better_capacity_moves_onto_a_plan_that_starts(tmp_path):
    # One on-demand node ($4/GPU-h) and a training plan node from t=1000 (prepaid).
    # 0: admitted on-demand; RUNNING 10. 1000: the plan starts, a pass runs: 4000 s left
    # x 8 GPUs x $4/h saves ~$35.6 vs ~$0.3 for the move -> checkpoint (8 GB at 1 GB/s)
    # done 1008 with 990 s saved; pass at 1010 -> the plan node; start-up 10 + read 8 ->
    # RUNNING 1028; 4010 s left -> done 5038. Plain ours stays: done at 5010.
    scn = scenario(regions=[{"name": "r1", "pools": [
        {"kind": "on_demand", "nodes": 1, "price_per_gpu_hour": 4.0},
        {"kind": "training_plan", "name": "p", "nodes": 1, "price_per_gpu_hour": 1.0,
         "start_s": 1000, "end_s": 100000}]}])
    moved = simulate(tmp_path, scn, [("a", 0, 5000, 8, "t")], policy=PolicyKind.BETTER_CAPACITY)
    j = moved.sj["a"]
    assert jct(moved, "a") == 5038
    assert j.job.placement.capacity_type == 3 and j.migrations == 1  # TRAINING_PLAN
    assert j.cost == {"on_demand": 8 * 4.0 * 1008 / 3600}
    stay = simulate(tmp_path, scn, [("a", 0, 5000, 8, "t")], policy=PolicyKind.OURS)
    assert jct(stay, "a") == 5010 and stay.sj["a"].cost["on_demand"] > j.cost["on_demand"]


def test_checkpoints_of_a_drain_share_the_store_and_queue(tmp_path):
    # As above, but two 8-GPU jobs in r1 and a store of 1 GB/s for the region: the two
    # 8 GB saves at 500 go one after the other (done 508 and 516), not both at 508.
    scn = scenario(regions=[
        {"name": "r1", "pools": [{"kind": "on_demand", "nodes": 2, "price_per_gpu_hour": 2.0}]},
        {"name": "r2", "pools": [{"kind": "on_demand", "nodes": 2, "price_per_gpu_hour": 2.0}]}],
        drains=[{"region": "r1", "start_s": 500, "end_s": 100000}])
    scn["checkpoint"] = {**scn["checkpoint"], "store_gbps": 1.0}
    sim = simulate(tmp_path, scn, [("a", 0, 1000, 8, "t"), ("b", 0, 1000, 8, "t")])
    saving = sorted(j.lost[Cause.REGION_DRAIN.value] for j in sim.sj.values())
    # a: 8 s saving + 26 s start-up; b: 16 s saving (8 waiting for a's write) + 26 s start-up
    # (placed at 520, after a's transfer and read at 510-526 left the link and store)
    assert saving == [(8 + 26) * 8, (16 + 26) * 8]
    unshared = simulate(tmp_path, {**scn, "checkpoint": {**scn["checkpoint"], "store_gbps": 100.0}},
                        [("a", 0, 1000, 8, "t"), ("b", 0, 1000, 8, "t")])
    assert jct(unshared, "b") < jct(sim, "b")
