#!/usr/bin/env python3
"""Print the docs' benchmark figures (markdown) from benchmarks/results/*.json.

Why: the docs quote measured figures; generating their tables from the committed
JSON keeps the two from disagreeing. Usage:
    python benchmarks/summarize.py          # print markdown
    python benchmarks/summarize.py --docs   # rewrite docs/benchmarks.md between the markers
(`python scripts/gen_docs.py` does the same along with the other generated pages.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BEGIN, END = "<!-- BENCHMARKS:BEGIN -->", "<!-- BENCHMARKS:END -->"


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def f(x: Any, digits: int = 1) -> str:
    return f"{x:,.{digits}f}" if isinstance(x, int | float) else str(x)


def placement(d: dict[str, Any]) -> list[str]:
    fp, inp, q = d["full_pass"], d["input"], d["quality"]
    load = d.get("load_average")
    out = [
        "### Placement (`python benchmarks/bench_placement.py`)",
        "",
        f"Synthetic cluster: {inp['gpus']:,} GPUs on {inp['nodes']:,} nodes, {inp['pending']:,} pending and "
        f"{inp['running']:,} running jobs, {inp['teams']} teams, quotas on."
        + (f" Load average at the end of the run: {' / '.join(f(x, 2) for x in load)} (1/5/15 min)." if load else ""),
        "",
        "| measure | value |",
        "|---|---|",
        f"| full pass, CPU time p50 / p99 | {f(fp['cpu_p50_ms'])} / {f(fp['cpu_p99_ms'])} ms |",
        f"| full pass, wall p50 / p99 | {f(fp['p50_ms'])} / {f(fp['p99_ms'])} ms |",
        f"| admissions per second within a pass | {f(fp['admissions_per_s'], 0)} |",
        f"| incremental admission throughput (admission cache) | {f(d['incremental']['admissions_per_s'], 0)} jobs/s |",
    ]
    inc = d["incremental"]
    if "from_scratch_admissions_per_s" in inc:
        out.append(f"| same passes from scratch (in-run baseline) | {f(inc['from_scratch_admissions_per_s'], 0)}"
                   f" jobs/s ({f(inc['speedup_vs_from_scratch'], 2)}x with the cache) |")
    live = d.get("live_scheduler")
    if live:
        out.append(f"| live scheduler: one submit and one finished attempt, then a pass (snapshot from the"
                   f" broker's records + decision),"
                   f" CPU p50 | {f(live['cpu_p50_ms'])} ms on the memos and admission cache;"
                   f" {f(live['from_scratch_cpu_p50_ms'])} ms from scratch"
                   f" ({f(live['speedup_vs_from_scratch'], 2)}x) |")
    out += [
        f"| peak memory (tracemalloc) | {f(fp['peak_mem_mb'])} MB |",
        "",
        "Growth: a full pass from scratch, and a warm pass on the admission cache (one job",
        "finished since the last pass; the whole queue decided again, the fleet not rebuilt).",
        "",
        "| scale | GPUs | pending | CPU p50 from scratch | CPU p50 warm |",
        "|---|---|---|---|---|",
    ]
    for g in d.get("growth", []):
        warm = f"{f(g['warm_cpu_p50_ms'])} ms" if "warm_cpu_p50_ms" in g else "-"
        out.append(f"| {g['scale']}x | {g['gpus']:,} | {g['pending']:,} | {f(g['cpu_p50_ms'])} ms | {warm} |")
    e, b = q["engine"], q["first_fit"]
    out += [
        "",
        "| quality (same input, quotas off) | engine | first fit |",
        "|---|---|---|",
        f"| jobs admitted | {e['admitted_jobs']:,} | {b['admitted_jobs']:,} |",
        f"| GPUs allocated | {e['gpus_allocated']:,} | {b['gpus_allocated']:,} |",
        f"| required-topology violations | {e['required_topology_violations']} | {b['required_topology_violations']} |",
        f"| gangs inside one block when one could hold them | {e['gang_share_in_one_block']:.0%} | {b['gang_share_in_one_block']:.0%} |",
        f"| largest free layer-3 block (GPUs) | {e['largest_free_layer3_block_gpus']} | {b['largest_free_layer3_block_gpus']} |",
        f"| pass time | {f(e['pass_ms'])} ms | {f(b['pass_ms'])} ms |",
    ]
    return out


def api(d: dict[str, Any]) -> list[str]:
    out = [
        "### Broker API (`python benchmarks/bench_api.py`)",
        "",
        "A real broker (`brokerctl serve`; with `api_workers`, its worker processes too) and "
        "grpc.aio clients (one connection each) on the same 2 cores; ~2 KB specs; GetJob/ListJobs "
        "over 100k stored jobs. \"vs no-op\" is the rate against the same server's cheapest RPC "
        "at the same concurrency in the same run; \"broker CPU / call\" counts every broker process.",
    ]
    runs = [k for k in d if isinstance(d[k], dict) and "submit_c16" in d[k]]
    runs.sort(key=lambda k: (k.split("_")[0] != "sqlite", d[k].get("api_workers", 0)))
    for key in runs:
        r = d[key]
        kind = key.split("_")[0]
        n = r.get("api_workers", 0)
        procs = (f", {n} API worker processes (`--set api_workers={n}`)" if n
                 else ", one broker process")
        cpu = "broker_cpu_ms_per_call" in r["noop_c16"]
        load = r.get("load_avg_1m")
        head = (f"{kind.capitalize()} store{procs} ({r['stored_jobs']:,} stored jobs; no-op RPC: {r['noop_rpc']}"
                + (f"; load average {load['start']} at the start, {load['end']} at the end" if load else "")
                + (f"; {r['jobs_per_store_write']} submits per store write (whole run)"
                   if "jobs_per_store_write" in r else "")
                + "):")
        out += ["", head, "",
                "| measurement | rate/s | p50 | p99 | vs no-op |" + (" broker CPU / call |" if cpu else ""),
                "|---|---|---|---|---|" + ("---|" if cpu else "")]
        rows = [(f"no-op, {c} clients", f"noop_c{c}") for c in (1, 16, 64)]
        rows += [(f"SubmitJob, {c} clients", f"submit_c{c}") for c in (1, 16, 64)]
        rows += [("GetJob, 16 clients", "get_c16"), ("ListJobs page of 100, 16 clients", "list_c16")]
        for label, k in rows:
            v = r[k]
            ratio = f"{v['ratio_vs_noop']:.2f}" if "ratio_vs_noop" in v else ""
            out.append(f"| {label} | {f(v['rate_per_s'], 0)} | {f(v['p50_ms'])} ms | {f(v['p99_ms'])} ms | {ratio} |"
                       + (f" {f(v['broker_cpu_ms_per_call'], 2)} ms |" if cpu else ""))
        w = r["watch"]
        out.append(f"| WatchJob fan-out: {w['watchers']:,} watchers x {w['rounds']}, cancel to terminal event "
                   f"| {f(w['deliveries_per_s'], 0)} deliveries/s | {f(w['p50_ms'])} ms | {f(w['p99_ms'])} ms "
                   f"| {w['missing']} missing |" + (" |" if cpu else ""))
        g = r.get("goal_c16")
        if g is not None:
            s16 = r["submit_c16"]
            out += ["", f"Goal at 16 clients: {f(s16['rate_per_s'], 0)}/s of >= 1,500 "
                    f"({'met' if g['rate_ge_1500'] else 'not met'}); p99 {f(s16['p99_ms'])} ms of <= 50 "
                    f"({'met' if g['p99_le_50ms'] else 'not met'}); {s16['ratio_vs_noop']:.2f} of the no-op "
                    f"rate, goal >= 0.5 ({'met' if g['ratio_ge_0.5'] else 'not met'})."]
        base = d.get(kind) if n else None
        if base is not None and base is not r:
            one = base["submit_c16"]["rate_per_s"]
            out += ["", f"Against one broker process in the same benchmark run: SubmitJob at 16 clients "
                    f"{f(r['submit_c16']['rate_per_s'] / one, 2)}x, at 64 clients "
                    f"{f(r['submit_c64']['rate_per_s'] / base['submit_c64']['rate_per_s'], 2)}x; "
                    f"broker CPU per submit {f(r['submit_c16']['broker_cpu_ms_per_call'], 2)} against "
                    f"{f(base['submit_c16']['broker_cpu_ms_per_call'], 2)} ms; WatchJob fan-out p99 "
                    f"{f(r['watch']['p99_ms'])} against {f(base['watch']['p99_ms'])} ms."]
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def checkpoint(d: dict[str, Any]) -> list[str]:
    loc, s3, a, r = d["local"], d["s3"], d["async"], d["resharding"]
    samples = d.get("raw_seconds", {}).get("phase_A", {}).get("samples")
    out = [
        "### Checkpoints (`python benchmarks/bench_checkpoint.py`)",
        "",
        f"{d['model']}: {d['params'] / 1e6:,.0f} M parameters, a {d['checkpoint_bytes'] / 1e9:.2f} GB checkpoint "
        f"from {d['ranks']} ranks. {d['machine']}.",
        "",
        "| measure | ours | raw copy of the same bytes | ratio |",
        "|---|---|---|---|",
        f"| local save | {f(loc['dcp_save_MBps'], 0)} MB/s | {f(loc['raw_copy_fsync_MBps'], 0)} MB/s (cp + fsync) | {loc['save_vs_raw']:.2f} |",
        (f"| local load | {f(loc['dcp_load_MBps'], 0)} MB/s | {f(loc['raw_read_MBps'], 0)} MB/s (read) | {loc['load_vs_raw']:.2f} |"
         if "raw_read_MBps" in loc else f"| local load | {f(loc['dcp_load_MBps'], 0)} MB/s | | |"),
        f"| S3 save | {f(s3['dcp_save_MBps'], 0)} MB/s | {f(s3['raw_boto3_upload_MBps'], 0)} MB/s (boto3) | {s3['save_vs_raw']:.2f} |",
        f"| S3 load | {f(s3['dcp_load_MBps'], 0)} MB/s | {f(s3['raw_boto3_download_MBps'], 0)} MB/s (boto3) | {s3['load_vs_raw']:.2f} |",
    ]
    steady = a.get("steady_blocked_s_median", a.get("async_blocked_s"))
    out.append(f"| async save: training blocked (steady state, median of saves 2..N) | "
               f"{f(steady, 2)} s | sync save {f(a['sync_save_s'], 2)} s | {a.get('blocked_ratio', 0):.2f} |")
    if "first_save_blocked_s" in a:
        out.append(f"| async save: first save (allocates staging buffers) | "
                   f"{f(a['first_save_blocked_s'], 2)} s | | {a.get('first_save_blocked_ratio', 0):.2f} |")
    if "first_save_after_warmup_blocked_s" in a:
        out.append(f"| async save: first save after the trainer's start-up warm-up "
                   f"({f(a['startup_warmup_s'], 2)} s, outside any save) | "
                   f"{f(a['first_save_after_warmup_blocked_s'], 2)} s | | "
                   f"{a['first_save_after_warmup_blocked_s'] / a['sync_save_s']:.2f} |")
    out += [
        f"| resharding load 2→1 ranks | {f(r['load_2_to_1_s'], 2)} s | same-size load {f(r['load_1_to_1_s'], 2)} s | {r['reshard_vs_same_size']:.2f} |",
    ]
    if "step_overhead" in d:
        so = d["step_overhead"]
        out.append(f"| step-time overhead, checkpoint every {so['checkpoint_every_steps']} steps | "
                   f"{f(so['overhead_pct'], 0)} % | | |")
    if samples:  # ratios of medians: the best-of figures above, checked against noise
        pairs = (("local save", "raw_local_copy_s", "local_save_s"),
                 ("local load", "raw_local_read_s", "local_load_s"),
                 ("S3 save", "raw_s3_up_s", "s3_save_s"),
                 ("S3 load", "raw_s3_down_s", "s3_load_s"))
        out += ["", f"Median of the {len(samples['local_save_s'])} runs each, ours vs raw: " + ", ".join(
            f"{name} {_median(samples[raw]) / _median(samples[ours]):.2f}" for name, raw, ours in pairs) + "."]
    if "method" in d:
        out += ["", f"How: {d['method']}"]
    return out


def digests(d: dict[str, Any]) -> list[str]:
    return [
        "### Checkpoint digests (`python benchmarks/bench_hash.py`)",
        "",
        f"One thread, {d['buffer_MiB']} MiB warm buffer hashed in 8 MiB chunks, best of {d['reps']}: "
        f"xxh3-128 {f(d['xxh3_128_GBps'], 2)} GB/s, sha256 {f(d['sha256_GBps'], 2)} GB/s "
        f"({d['xxh3_vs_sha256']:.1f}×). Manifests carry xxh3-128 since version 3.",
    ]


def migration(d: dict[str, Any]) -> list[str]:
    parts = d.get("orchestration_parts_s", {})
    return [
        "### Migration (`python benchmarks/bench_migration_e2e.py`)",
        "",
        f"A {d['params'] / 1e6:,.0f} M-parameter job ({d['checkpoint_bytes'] / 1e9:.2f} GB checkpoint) moved "
        f"{d['route']}: real broker, agents, trainer and moto S3.",
        "",
        "| phase | seconds |",
        "|---|---|",
        f"| checkpoint (stop request → durable) | {f(d['checkpoint_s'], 2)} |",
        f"| transfer ({d['transfer_method']}, {f(d['transfer_MBps'])} MB/s; raw copy {f(d['raw_s3_server_copy_MBps'])} MB/s, ratio {d['transfer_vs_raw']:.2f}) | {f(d['transfer_s'], 2)} |",
        f"| relaunch to first step (incl. checkpoint load {f(d['relaunch_checkpoint_load_s'], 2)} s) | {f(d['relaunch_s'], 2)} |",
        f"| **broker orchestration** (everything but bytes moved and process start) | **{f(d['orchestration_s'], 3)}** |",
        f"| total | {f(d['total_s'], 2)} |",
        "",
        "Orchestration parts (s): " + ", ".join(f"{k} {v}" for k, v in parts.items()) + ".",
    ]


def mbb(d: dict[str, Any]) -> list[str]:
    """Two moves of one job (planned with pre-copy, spot notice) against one same-run floor."""
    if "moves" not in d:
        return mbb_single(d)
    fl, pl, sp = d["floor"], d["moves"]["planned"], d["moves"]["spot"]
    spot = sp["spot_notice"]
    la = d["load_average"]
    params = f"{d['params'] / 1e6:,.0f} M-parameter" if d.get("params") else d["model"]
    names = [k.removesuffix("_s").replace("_", " ") for k in pl["phases_s"]]

    def row(label: str, a: Any, b: Any, digits: int = 2) -> str:
        return f"| {label} | {f(a, digits) if a is not None else 'n/a'} | {f(b, digits) if b is not None else 'n/a'} |"

    def bg(mv: dict[str, Any]) -> str:
        b = mv.get("background_durability_copy")
        return f"{b['seconds']:.2f} ({b['method']})" if b else "not finished when measured"

    pc = pl.get("precopy") or {}
    out = [
        "### Make-before-break migration (`python benchmarks/bench_mbb.py`)",
        "",
        f"A {params} job ({d['checkpoint_bytes'] / 1e9:.2f} GB checkpoint, {d['checkpoint_files']} files), "
        f"ranks {d['ranks']}, moved twice in one run by the broker and its agents: a planned move "
        f"({pl['route']}) and a 2-minute spot notice ({sp['route']}). {d['machine']}; load average "
        f"{la['start_1_5_15'][0]:.2f} at the start, {la['end_1_5_15'][0]:.2f} at the end (1 min). "
        "Downtime = the source's last step ends → the destination starts its first step; floor = raw "
        "write + raw read of the same files, same store (moto on loopback), same run, one stream per "
        "file like the ranks, measured after the moves with nothing else running.",
        "",
        "| measure (seconds) | planned move | spot notice |",
        "|---|---|---|",
        row("**downtime**", pl["downtime_s"], sp["downtime_s"]),
        f"| floor: raw write {f(fl['raw_write_s'], 2)} + raw read {f(fl['raw_read_s'], 2)} "
        f"| {f(fl['floor_s'], 2)} | {f(fl['floor_s'], 2)} |",
        row("downtime / floor (goal ≤ 1.3)", pl["downtime_vs_floor"], sp["downtime_vs_floor"]),
    ]
    for key, name in zip(pl["phases_s"], names, strict=True):
        out.append(row(f"phase: {name}", pl["phases_s"][key], sp["phases_s"].get(key)))
    for key in pl["inside_phases_s"]:
        out.append(row(f"inside: {key.split(' (')[0].removesuffix('_s').replace('_', ' ')}",
                       pl["inside_phases_s"][key], sp["inside_phases_s"].get(key)))
    out += [
        row("standby: parked waiting for the go", pl["standby"].get("parked_waiting_for_go_s"),
            sp["standby"].get("parked_waiting_for_go_s")),
        row("first step's own compute (not downtime)", pl["first_step_compute_s"], sp["first_step_compute_s"]),
        f"| background durability copy (off the critical path) | {bg(pl)} | {bg(sp)} |",
        "",
        (f"Pre-copy (planned move): {pc.get('mb', 0):,.0f} MB of {pc.get('from', '').rpartition('/')[2]} "
         f"copied into {pl['route'].split(' -> ')[1].split(' ')[0]} in {f(pc.get('seconds'), 2)} s "
         f"({pc.get('method')}) while the source trained; its Stop went "
         f"{f(pc.get('stop_held_s (move decided -> Stop sent)'), 1)} s after the move was decided "
         "(pre-copy done and the standby parked)." if pc else "Pre-copy: none (no periodic checkpoint)."),
        "",
        f"Spot notice: final checkpoint durable {f(spot.get('notice_to_durable_s'), 1)} s after the "
        f"notice, **{f(spot.get('margin_s (deadline - durable)'), 1)} s before the 2-minute deadline** "
        f"(met: {'yes' if spot.get('met') else 'NO'}); the trainer used the stop's own grace "
        f"({sp.get('trainer_grace')}).",
    ]
    if d.get("note"):
        out += ["", d["note"]]
    return out


def mbb_single(d: dict[str, Any]) -> list[str]:
    fl, ph, inside, sb, spot = d["floor"], d["phases_s"], d["inside_phases_s"], d["standby"], d["spot_notice"]
    bg = d.get("background_durability_copy") or {}
    params = f"{d['params'] / 1e6:,.0f} M-parameter" if d.get("params") else d["model"]
    out = [
        "### Make-before-break migration (`python benchmarks/bench_mbb.py`)",
        "",
        f"A {params} job ({d['checkpoint_bytes'] / 1e9:.2f} GB checkpoint, {d['checkpoint_files']} files), "
        f"ranks {d['ranks']}, moved {d['route']}; {d['mode']} mode ({d['machine']}). "
        "Downtime = the source's last step ends → the destination resumes training; floor = raw write + "
        "raw read of the same files, same store" + ("." if fl.get("source") else ", same run."),
        "",
        "| measure | seconds |",
        "|---|---|",
        f"| **downtime** | **{f(d['downtime_s'], 2)}** |",
        f"| floor: raw write {f(fl['raw_write_s'], 2)} + raw read {f(fl['raw_read_s'], 2)} | {f(fl['floor_s'], 2)} |",
        f"| downtime / floor (goal ≤ 1.3) | {d['downtime_vs_floor']:.2f} |",
    ]
    if fl.get("source"):
        out.insert(-5, f"Floor: {fl['source']}")
        out.insert(-5, "")
    for k, v in ph.items():
        out.append(f"| phase: {k.removesuffix('_s').replace('_', ' ')} | {f(v, 2)} |")
    for k, v in inside.items():
        out.append(f"| inside: {k.split(' (')[0].removesuffix('_s').replace('_', ' ')} | {f(v, 2)} |")
    out += [
        f"| standby: parked waiting for the go | {f(sb.get('parked_waiting_for_go_s'), 2)} |",
        f"| first step's own compute (not downtime) | {f(d['first_step_compute_s'], 2)} |",
        f"| background durability copy ({bg.get('method', 'n/a')}, off the critical path) | "
        f"{f(bg['seconds'], 2) if bg else 'not finished when measured'} |",
        f"| spot notice: SIGTERM → final checkpoint durable (notice {f(spot['notice_s'], 0)} s) | "
        f"{f(spot.get('sigterm_to_durable_s'), 2)} |",
        "",
        f"Previous break-before-make figure: {d['baseline_break_before_make']}.",
    ]
    for key in ("runs",):
        if d.get(key):
            out += ["", f"Runs: {d[key]}."]
    if spot.get("note"):
        out += ["", f"Spot notice: {spot['note'].rstrip('.')}."]
    return out


def transfer(d: dict[str, Any]) -> list[str]:
    out = [
        "### Checkpoint transfer between regions (`python benchmarks/bench_migration.py`)",
        "",
        f"{d['checkpoint']}, {d['checkpoint_bytes'] / 1e9:.2f} GB in {d['files']} files; {d['machine']}.",
        "",
        "| move | raw boto3 MB/s | copy_checkpoint MB/s | ratio | method |",
        "|---|---|---|---|---|",
    ]
    for name, c in d["cases"].items():
        out.append(f"| {name} | {f(c['raw_mb_per_s'])} | {f(c['copy_checkpoint_mb_per_s'])} | {c['ratio']:.2f} | {c['method']} |")
    return out


def store(d: dict[str, Any]) -> list[str]:
    out = [
        "### State store (`python benchmarks/bench_store.py`)",
        "",
        "| store | CAS updates/s (1 thread) | (4 threads) | event appends/s |",
        "|---|---|---|---|",
    ]
    for key, label in (("sqlite_synchronous_full", "SQLite, synchronous=FULL (default)"),
                       ("sqlite_synchronous_normal", "SQLite, synchronous=NORMAL"),
                       ("redis_local_no_persistence", "Redis on loopback")):
        if key in d:
            r = d[key]
            out.append(f"| {label} | {f(r['cas_updates_per_s'], 0)} | {f(r['cas_updates_per_s_4_threads'], 0)} | "
                       f"{f(r['event_appends_per_s'], 0)} |")
    return out


def store_failover(d: dict[str, Any],
                   title: str = "### State store failover (`python benchmarks/store_failover.py`)",
                   ) -> list[str]:
    sn = d["sentinel"]
    out = [
        title,
        "",
        f"Redis primary SIGKILLed mid-burst; primary + {sn['replicas']} replicas + {sn['sentinels']} "
        f"Sentinels (quorum {sn['quorum']}, down-after {sn['down_after_ms']} ms), {d['writers']} "
        "submitting threads and one ending running jobs; a fresh cluster per repetition. "
        "\"failover\": SIGKILL until the Sentinels name a writable new primary; \"writes resume\": "
        "SIGKILL until the first acknowledged write begun after it. "
        f"Load average {d['loadavg_start'][0]:.1f} at start, {d['loadavg_end'][0]:.1f} at end "
        f"({d['cpus']} CPUs, shared).",
        "",
        "| replica confirmation | reps | acked submits | acked terminal updates | acked lost "
        "| failover median / max s | writes resume max s | submits/s before kill (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    waited = str(sn.get("min_replicas", "1"))  # runs before the "all" default waited for 1
    wait_label = ("every promotable replica (min_replicas=all)" if waited == "all"
                  else f"WAIT {waited} (min_replicas={waited})")
    for key, label in (("wait", wait_label), ("baseline_no_wait", "none (min_replicas=0)")):
        r = d["summary"].get(key)
        if r and r["reps"]:
            out.append(f"| {label} | {r['reps']} | {r['acked_submits']:,} | {r['acked_terminal']:,} | "
                       f"{r['acked_lost']} | {f(r['failover_s_median'], 2)} / {f(r['failover_s_max'], 2)} | "
                       f"{f(r['writes_resume_s_max'], 2)} | {f(r['submit_rate_before_kill_median'], 0)} |")
    b = d.get("broker_summary") or {}
    if b.get("reps") and "terminal_lost" not in b:  # an older run: totals only
        out += ["", f"Through a real broker ({b['reps']} repetitions, scripted agent, leader lease "
                f"{d['broker_runs'][0]['lease_s']:.0f} s): {b['acked_lost']} acknowledged submits or "
                f"terminal updates lost; the scheduler launched a job submitted after the kill at most "
                f"{b['schedule_resume_s_max']:.2f} s after it (failover + one lease, smallest: "
                f"{b['failover_plus_lease_s_min']:.2f} s)."]
    elif b.get("reps"):
        out += _broker_failover_lines(d)
    return out


def store_failover_write_group(d: dict[str, Any]) -> list[str]:
    """The same fault with a Redis write group (one pipeline and one WAIT for the writes
    that queue together) that was measured and not kept: its note says why."""
    return store_failover(d, "### State store failover with a Redis write group, not kept"
                             " (`python benchmarks/store_failover.py`)")


def store_failover_broker(d: dict[str, Any]) -> list[str]:
    """The broker-level failover run alone (its own JSON; the store-level one is above)."""
    sn = d["sentinel"]
    errors = d.get("broker_errors") or []
    out = ["### State store failover through a broker (`python benchmarks/store_failover.py "
           f"--reps 0 --baseline-reps 0 --broker-reps {d['broker_summary']['reps'] + len(errors)} "
           f"--broker-baseline-reps {d['broker_baseline_summary']['reps']}`)", "",
           f"Redis primary SIGKILLed during a submit burst and running jobs' terminal updates; primary + "
           f"{sn['replicas']} replicas + {sn['sentinels']} Sentinels (down-after {sn['down_after_ms']} ms), "
           "a fresh cluster and broker per repetition."
           + (" The broker's writes wait for every replica the Sentinels may promote (the default "
              "`min_replicas=all`)." if sn.get("min_replicas") == "all" else "")]
    out += _broker_failover_lines(d)
    b = d["broker_summary"]
    attached = (f"; the promoted primary had a replica online again (from then on writes can be "
                f"confirmed) at most {f(b['replica_attached_s_max'], 2)} s after the SIGKILL, and the "
                f"scheduler resumed within that + one lease in "
                f"{b['reps_within_replica_attached_plus_lease']} of {b['reps']}"
                if b.get("replica_attached_s_max") is not None else "")
    out += ["", f"Failover (SIGKILL until the Sentinels name a writable primary) at most "
            f"{f(b['failover_s_max'], 2)} s{attached}. Load average {d['loadavg_start'][0]:.1f} at start, "
            f"{d['loadavg_end'][0]:.1f} at end ({d['cpus']} CPUs, shared)."
            + ("" if d.get("complete", True) else " The run was cut short: these are the repetitions"
               " it finished.")
            + (f" Repetitions that could not finish: {len(errors)} ({'; '.join(errors)[:300]})."
               if errors else "")]
    return out


def _broker_failover_lines(d: dict[str, Any]) -> list[str]:
    """The broker-level repetitions: a real broker, clients submitting, a scripted agent
    ending jobs across the SIGKILL (half of them with its stream cut mid-failover), and
    the baseline with the scripted agent's old Register."""
    lease = d["broker_runs"][0]["lease_s"]
    out = ["", f"Through a real broker (TLS gRPC, leader lease {lease:g} s), 3 clients submitting and "
           "a scripted agent ending 6 running jobs, 3 of them after the kill; in the reconnect "
           "repetitions the agent's stream is cut mid-failover and it dials again once the new "
           "primary is up, re-sending unacknowledged ends as the real agent does. \"scheduler "
           "resumes\": SIGKILL until a job submitted after it is launched.", "",
           "| scenario | reps | acked submits | acked ends | submits lost | ends lost "
           "| relaunched as missing | scheduler resumes median / max s | within failover + lease |",
           "|---|---|---|---|---|---|---|---|---|"]
    for key, label in (("broker_summary", "real broker (half with a reconnect)"),
                       ("broker_baseline_summary", "baseline: old scripted Register, reconnect")):
        r = d.get(key) or {}
        if r.get("reps"):
            out.append(f"| {label} | {r['reps']} | {r['acked_submits']:,} | {r['acked_terminal']} | "
                       f"{r['submits_lost']} | {r['terminal_lost']} | {r['relaunched']} | "
                       f"{f(r['schedule_resume_s_median'], 2)} / {f(r['schedule_resume_s_max'], 2)} | "
                       f"{r['reps_within_failover_plus_lease']} of {r['reps']} |")
    return out


def workdir(d: dict[str, Any]) -> list[str]:
    o = d["ours"]
    met = "met" if d["ratio"] >= d["goal_ratio"] else "**not met**"
    out = [
        "### Workdir upload and fetch (`python benchmarks/bench_workdir.py`)",
        "",
        f"A generated {d['bytes'] / 1e6:.0f} MB workdir (random bytes, 9 small files per 1 MB one) from "
        "the user's directory to an attempt's cwd through a real broker (loopback gRPC, local blob "
        "store with fsync) and the agent's fetch code, against a raw copy of the same files along the "
        "same route (user dir → broker store → agent cache → attempt dir, `shutil.copytree`, no "
        f"fsync). Median of {d['runs']} alternating runs. {d['machine']}.",
        "",
        "| step | seconds |",
        "|---|---|",
        f"| pack + upload (SDK, sha256 pass then stream) | {f(o['upload_s'], 2)} |",
        f"| fetch + verify (agent cache) | {f(o['fetch_s'], 2)} |",
        f"| unpack into the attempt dir | {f(o['unpack_s'], 2)} |",
        f"| **total** ({f(d['ours_mb_per_s'], 0)} MB/s) | **{f(o['total_s'], 2)}** |",
        f"| raw copy along the same route ({f(d['raw_mb_per_s'], 0)} MB/s) | {f(d['raw_copy_s'], 2)} |",
        f"| ratio raw / ours, whole route (goal ≥ {d['goal_ratio']}: {met}) | {f(d['ratio'], 2)} |",
    ]
    if "upload_fetch_ratio" in d:
        met2 = "met" if d["upload_fetch_ratio"] >= d["goal_ratio"] else "**not met**"
        out += [
            f"| upload + fetch alone vs the first two copies ({f(d['upload_fetch_s'], 2)} vs"
            f" {f(d['raw_two_hops_s'], 2)} s; goal: {met2}) | {f(d['upload_fetch_ratio'], 2)} |",
        ]
    return out + [
        "",
        "What costs: the bytes are hashed three times by design (client, broker before storing, "
        "agent before using), pass through user space twice over gRPC (1 MiB messages: measured "
        "about twice as fast as 4 MiB ones on loopback) and the broker fsyncs its blob, while "
        "`copytree` copies inside the kernel; unpacking uses `copy_file_range` too. Two runs in a "
        "row gave whole-route ratios of 0.88 and 0.83 on this shared machine.",
    ]


def unpack(d: dict[str, Any]) -> list[str]:
    m = d["median_s"]
    out = [
        "### Workdir unpack as the job's uid (`sudo python benchmarks/bench_unpack.py`)",
        "",
        f"A {d['bytes'] / 1e6:.0f} MB workdir of {d['files']} files unpacked into an attempt"
        " directory by our fd-relative extractor (no link followed, no reliance on tarfile's"
        " filter), in the agent's process and in a child dropped to the job's uid (what a"
        " root agent with job identities does), against a plain `shutil.copytree` of the"
        f" unpacked tree in the same run. Median of {d['runs']} alternating runs;"
        f" {d['machine']}; load average {d['load_avg_1m']['start']} at the start,"
        f" {d['load_avg_1m']['end']} at the end.",
        "",
        "| how | seconds |",
        "|---|---|",
        f"| extractor, in the agent's process | {f(m['in_process'], 2)} |",
    ]
    if "as_job_user" in m:
        out.append(f"| extractor, in a child as the job's uid | {f(m['as_job_user'], 2)} |")
    out += [f"| baseline: `copytree` of the unpacked tree | {f(m['copytree'], 2)} |"]
    if d.get("as_job_user_over_in_process") is not None:
        out += ["", "Ratio as the job's uid / in process:"
                f" {f(d['as_job_user_over_in_process'], 2)}; extractor / `copytree`:"
                f" {f(d['in_process_over_copytree'], 2)}."]
    return out


def library(d: dict[str, Any]) -> list[str]:
    out = [
        "### Training library overhead (`python benchmarks/bench_library.py`)",
        "",
        f"The same training loop ({d['model']}, {d['ranks']} ranks, global batch {d['global_batch']}) with and "
        f"without `import trainer`: progress file, signal agreement every step, async checkpoint every "
        f"{d['checkpoint_every']} steps (waited for inside the measured phase). Median of {d['rounds']} "
        f"alternating phases of {d['steps_per_phase']} steps; {d['machine']}.",
        "",
        "Wall time on this shared machine swings by tens of percent between phases (1-minute load average "
        f"{d.get('load_average_1min', ['?'])[0]} at the start on 2 cores), so read the CPU-time line (all "
        "threads, background uploads included) and the time spent inside library calls.",
        "",
        "| loop | wall ms/step |",
        "|---|---|",
        f"| plain PyTorch | {f(d['plain_ms_per_step'], 2)} |",
        f"| library hooks only (`step_done`, no checkpoints) | {f(d['hooks_ms_per_step'], 2)} |",
        f"| with the library | {f(d['library_ms_per_step'], 2)} |",
        f"| **overhead**, median of per-round ratios (goal < {d['goal']:.0%}) | **{d['overhead']:+.2%}** |",
        f"| CPU time per step, all threads (plain / hooks / library) | {f(d['plain_cpu_ms_per_step'], 1)} / "
        f"{f(d['hooks_cpu_ms_per_step'], 1)} / {f(d['library_cpu_ms_per_step'], 1)} ms: hooks "
        f"{d['hooks_cpu_overhead']:+.2%}, library **{d['cpu_overhead']:+.2%}** |",
        f"| training thread inside library calls | {f(d['in_library_ms_per_step'], 2)} ms "
        f"({d['in_library_share']:.2%} of a step) |",
    ]
    if d.get("async_save_blocked_ms_median") is not None:
        out.append(f"| training thread blocked per async save (median of {d['saves']}) | "
                   f"{f(d['async_save_blocked_ms_median'], 1)} ms |")
    return out


def chaos(d: dict[str, Any]) -> list[str]:
    """The fault campaign (benchmarks/chaos.py): what was injected, how fast the system
    recovered, and whether anything was lost, doubled, wrong or stuck."""
    kinds = list(d["by_kind"])
    # Only the kinds asked for when a run was limited to a few (a full run has them all).
    only = f" --kinds {','.join(kinds)}" if 0 < len(kinds) <= 2 else ""
    store = {"redis": "over Redis; brokers, agents and Redis",
             "redis-sentinel": "over a Redis primary with 2 replicas and 3 Sentinels; brokers and agents",
             }.get(d["store"], "on one SQLite file; brokers and agents")
    where = (" as hosts in network namespaces" if d.get("netns", True) else " on loopback")
    out = [
        f"### Fault campaign, {d['store']}{' (' + ', '.join(kinds) + ')' if only else ''} "
        f"(`python benchmarks/chaos.py --jobs {d['jobs']} "
        f"--faults {d.get('faults_scheduled', len(d['faults']))} --seed {d['seed']}"
        f"{' --store ' + d['store'] if d['store'] != 'redis' else ''}"
        f"{'' if d.get('netns', True) else ' --no-netns'}{only}"
        f"{' --step-sleep ' + format(d['step_sleep_s'], 'g') if d.get('step_sleep_s', 0.3) != 0.3 else ''}"
        f"{' --api-workers ' + str(d['api_workers']) if d.get('api_workers') else ''}"
        f"{' --spread-outages' if d.get('spread_outages') else ''}`)",
        "",
        f"{d['jobs']} mixed jobs (1-2 nodes, two teams, three priorities, spot, elastic; a checkpoint "
        "every 4 steps) on 3 regions, two broker replicas with leader election "
        f"{'(each with ' + str(d['api_workers']) + ' API worker processes) ' if d.get('api_workers') else ''}"
        f"{store}{where}, S3 (moto) behind a fault proxy; faults one after the "
        f"other (seed {d['seed']}). Recovery: from injection until a leader answers, every agent is "
        "connected and every job that was running has stepped since (fault duration included). "
        f"Link slowdowns used `{d.get('slow_link') or 'n/a'}`. Wall time {f(d['wall_s'], 0)} s.",
        "",
        "| fault kind | n | recovered | p50 s | p95 s | max s |",
        "|---|---|---|---|---|---|",
    ]
    for kind, k in d["by_kind"].items():
        out.append(f"| {kind} | {k['n']} | {k['recovered']} | {k.get('p50_s', '-')} | "
                   f"{k.get('p95_s', '-')} | {k.get('max_s', '-')} |")
    out += _outage_recovery_lines(d)
    load = d.get("load_avg_1m")
    busy = (f"1-minute load average mean {load['mean']:g}, max {load['max']:g}" if isinstance(load, dict)
            else f"1-minute load average {load}" if load else "load not recorded")
    applied = len(d["faults"])
    scheduled = d.get("faults_scheduled", applied)
    faults = (f"{applied} of {scheduled} scheduled faults were applied; the rest were due after every "
              "job had ended" if scheduled > applied else f"{applied} faults")
    notes = ["", d["note"]] if d.get("note") else []
    return out + notes + ["", f"`{d['summary']}`", "",
                  f"Goal of the fault campaign: 200 jobs, every fault kind, nothing lost, doubled, wrong or stuck. "
                  f"This run: {d['jobs']} jobs, {len(d['by_kind'])} kinds, {faults}; {d['attempts_total']} "
                  f"attempts in all (at most {d['attempts_max']} for one job); {busy} on the 2 cores "
                  "(recovery times stretch with load)" + (f"; code at commit `{d['commit']}`." if d.get("commit")
                                                           else ".")]


def _outage_recovery_lines(d: dict[str, Any]) -> list[str]:
    """Store outages only (runs that recorded them): each job an outage held up, from the
    outage's end until it stepped again, against the goal p95 <= 30 s; and the check that
    no job showed a step below its durable checkpoint."""
    r = d.get("outage_recovery")
    if not r:
        return []
    met = "met" if r.get("goal_met") else "NOT met"
    below = d.get("below_durable", [])
    rs = r.get("reached_store")
    beside = "" if not rs else (
        f" Beside it, without the {rs['not_reached']} starts whose ranks were still importing"
        f" when the outage ended (they never met the store down): {rs['n']} jobs, p50"
        f" {rs.get('p50_s', '-')} s, p95 {rs.get('p95_s', '-')} s, max {rs.get('max_s', '-')} s;"
        f" p95 <= {f(r['goal_p95_s'], 0)} s {'met' if rs.get('goal_met') else 'NOT met'}.")
    return ["", f"Store outages ({r['outages']}, {f(r['outage_s_min'], 0)}-{f(r['outage_s_max'], 0)} s"
                f" each): {r['n']} jobs held up in all; from the outage's end until each stepped"
                f" again (or ended): p50 {r.get('p50_s', '-')} s, p95 {r.get('p95_s', '-')} s,"
                f" max {r.get('max_s', '-')} s, {r['unrecovered']} not within the cap; goal p95"
                f" <= {f(r['goal_p95_s'], 0)} s {met}.{beside} Samples that showed a job below its"
                f" durable checkpoint: {len(below)}."]


def sim(d: dict[str, Any]) -> list[str]:
    out = [
        "### Fleet simulator (`python benchmarks/bench_sim.py`)",
        "",
        f"Policies `{d['policy']}` on `{d['trace']}` with scenario `{d['scenario']}`; CPU time of one"
        " simulation (the policy comparison is docs/sim/results.md; `static-quota` has the longest"
        " queues, so it is the slowest policy)."
        + (f" 1-minute load average {d['load_avg_1m']['start']} at the start, {d['load_avg_1m']['end']} at the end"
           " (a shared 2-core machine: CPU time is the measure)." if "load_avg_1m" in d else ""),
        "",
        "| policy | share of trace | jobs | events | scheduler passes | CPU s | events / CPU-s | in placement"
        " | CPU vs 1/4 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in d["runs"]:
        out.append(f"| {r.get('policy', d['policy'])} | {r['fraction']:g} | {r['jobs']:,} | {r['events']:,}"
                   f" | {r['passes']:,} | {f(r['cpu_s'])}"
                   f" | {f(r['events_per_cpu_s'], 0)} | {r['engine_share']:.0%} | {r['cpu_vs_quarter']:.2f}x"
                   f" (jobs {r['jobs_vs_quarter']:.2f}x) |")
    return out


def console(d: dict[str, Any]) -> list[str]:
    base, full = d["baseline_empty"], d["fleet"]
    calls = d.get("broker_calls", {})
    return [
        "### Console fleet page (`python benchmarks/bench_console.py`)",
        "",
        f"The fleet heat map in headless Chromium (Playwright, browser navigation timing, median "
        f"of {d['repeat']} loads) over a real broker with {d['nodes']:,} nodes "
        f"({full['cells']:,} cells) and {d['jobs']:,} jobs ({d['allocated_gpus']:,} GPUs "
        f"placed), against the same page over an empty fleet. {d['cpus']} CPUs, Python "
        f"{d['python']}"
        + (f", 1-minute load average {d['load_avg_1m']} while measuring (a shared machine: "
           f"the figures grow with it)" if "load_avg_1m" in d else "") + ".",
        "",
        "| measure | value |",
        "|---|---|",
        f"| empty fleet: load | {f(base['load_ms'], 0)} ms |",
        f"| **{d['nodes']:,} nodes, {d['jobs']:,} jobs: load** (goal < {d['goal_ms']} ms: "
        f"{'met' if d['met'] else 'NOT met'}) | **{f(full['load_ms'], 0)} ms** |",
        f"| ... of which first byte (the console's broker calls + render) | "
        f"{f(full['ttfb_ms'], 0)} ms |",
        f"| page size | {full['bytes'] / 1e6:.2f} MB |",
        f"| ratio vs empty fleet | {d['ratio']:.1f}x |",
        f"| broker calls alone (ListRegions / GetCapacity with nodes, made in parallel) | "
        f"{f(calls.get('list_regions_ms', 0), 0)} / "
        f"{f(calls.get('get_capacity_nodes_ms', 0), 0)} ms |",
    ]


def usage_series(d: dict[str, Any]) -> list[str]:
    load = d.get("loadavg_1_5_15") or [0.0]
    return [
        "### Usage series (`python benchmarks/bench_usage_series.py`)",
        "",
        f"What keeping the console's charts costs the broker, with {d['live_jobs']:,} live jobs of "
        f"{d['teams']} teams on {d['nodes']:,} nodes (best of {d['reps']}, one thread, 1-minute "
        f"load average {load[0]:.1f}: a shared machine). A sample runs at most every 5 s on the "
        "scheduler's thread; the save once a minute; a query per console refresh.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| baseline: one walk over the live jobs testing their phase | {f(d['baseline_walk_us'], 0)} us |",
        f"| baseline: the same sums read from the jobs' protobuf fields | "
        f"{f(d['baseline_protobuf_sample_us'], 0)} us |",
        f"| **a sample** (from the pass's snapshot, into three tiers) | **{f(d['sample_us'], 0)} us** "
        f"({d['sample_vs_protobuf']:.2f}x the protobuf read) |",
        f"| counting an admission | {f(d['admission_us'], 1)} us |",
        f"| save: 24 h of tiers to a message / its size / one SQLite write | "
        f"{f(d['save_to_message_ms'], 0)} ms / {d['saved_bytes'] / 1e3:,.0f} KB / "
        f"{f(d['save_sqlite_write_ms'], 1)} ms |",
        f"| GetUsageSeries answer, 1 h / 24 h (every team) | {f(d['query_1h_ms'], 0)} ms "
        f"({d['query_1h_bytes'] / 1e3:,.0f} KB) / {f(d['query_24h_ms'], 0)} ms "
        f"({d['query_24h_bytes'] / 1e3:,.0f} KB) |",
    ]


def auth(d: dict[str, Any]) -> list[str]:
    def met(r: float) -> str:
        return "met" if r >= d["goal_ratio"] else "**not met**"

    sub, get, bare = d["submit_per_s"], d["get_per_s"], d["bare_grpc_per_s"]
    return [
        "### TLS and authentication (`python benchmarks/bench_auth.py`)",
        "",
        f"Two brokers in one process (SQLite, loopback gRPC, {d['threads']} client threads, "
        f"{d['seconds']:.0f} s per phase, median of {d['rounds']} alternating rounds): TLS + a member's "
        "bearer token (argon2-verified once, then cached) + authorization + audit, against the same "
        f"broker in insecure dev mode. {d['machine']}.",
        "",
        "| calls/s | TLS + auth | insecure | ratio (goal ≥ 0.8) |",
        "|---|---|---|---|",
        f"| SubmitJob | {f(sub['tls_auth'], 0)} | {f(sub['insecure'], 0)} | "
        f"{d['submit_ratio']:.2f} ({met(d['submit_ratio'])}) |",
        f"| GetJob | {f(get['tls_auth'], 0)} | {f(get['insecure'], 0)} | "
        f"{d['get_ratio']:.2f} ({met(d['get_ratio'])}) |",
        f"| empty RPC, bare gRPC server (TLS only, no auth) | {f(bare['tls'], 0)} | "
        f"{f(bare['plaintext'], 0)} | {d['bare_tls_ratio']:.2f} |",
        "",
        "The last row is gRPC's TLS transport alone on the same machine: the share of the cost "
        "that no auth design can remove.",
    ]


def peer_gate(d: dict[str, Any]) -> list[str]:
    get, p50 = d["get_per_s"], d["p50_ms"]
    lb, la = d["load_avg_before"][0], d["load_avg_after"][0]
    return [
        "### Connection gate (`python benchmarks/bench_peer_gate.py`)",
        "",
        f"Two TLS brokers in one process (SQLite, loopback, {d['threads']} client threads, "
        f"{d['seconds']:.0f} s per phase, median of {d['rounds']} alternating rounds): one with "
        "`max_connections_per_address` (its gate relays every byte of the public port in one "
        "Python thread), one without. GetJob of a small job and of one with "
        f"{d['big_reply_bytes'] // 1024} KiB of env (a bulk reply). {d['machine']}; load average "
        f"{lb:.1f} before, {la:.1f} after.",
        "",
        "| GetJob | gated calls/s | direct calls/s | ratio | gated p50 ms | direct p50 ms |",
        "|---|---|---|---|---|---|",
        f"| small | {f(get['gated']['small'], 0)} | {f(get['direct']['small'], 0)} | "
        f"{d['ratio_small']:.2f} | {p50['gated']['small']:.1f} | {p50['direct']['small']:.1f} |",
        f"| {d['big_reply_bytes'] // 1024} KiB reply | {f(get['gated']['big'], 0)} | "
        f"{f(get['direct']['big'], 0)} | {d['ratio_big']:.2f} | {p50['gated']['big']:.1f} | "
        f"{p50['direct']['big']:.1f} |",
        "",
        "Why the gate is off by default: it costs every call a relay hop in the broker's "
        "process. Turn it on where one address could exhaust the broker's connections.",
    ]


def streams(d: dict[str, Any]) -> list[str]:
    base, load_ = d["no_streams"], d["with_idle_streams"]
    return [
        "### Idle streams vs reads (`python benchmarks/bench_streams.py`)",
        "",
        f"GetJob latency over {d['calls']:,} calls with {d['idle_streams']:,} idle streams open "
        f"({d['idle_streams'] * 9 // 10:,} agent streams that never register, "
        f"{d['idle_streams'] // 10:,} watches) against the same broker with none, over TLS with "
        "real credentials; every call "
        "answered.",
        "",
        "| measure | no streams | idle streams | ratio |",
        "|---|---|---|---|",
        f"| p50 (ms) | {f(base['p50_ms'], 2)} | {f(load_['p50_ms'], 2)} | {f(d['p50_ratio'], 2)} |",
        f"| p99 (ms) | {f(base['p99_ms'], 2)} | {f(load_['p99_ms'], 2)} | {f(d['p99_ratio'], 2)} |",
        "",
        "What costs: the watches' safety-net re-reads (one store read each every 0.5 s) and "
        "1,000 threads sharing the GIL; not queueing, since unary RPCs have threads of their own "
        "(`max_workers`) that streams cannot take.",
    ]


def proactive_rules(d: dict[str, Any]) -> list[str]:
    out = [
        "### Proactive moves (`python benchmarks/bench_proactive.py`)",
        "",
        "The rules the scheduler runs after a pass (at most every `proactive_interval_s`) on"
        " bench_placement's fleet, every running on-demand job consenting, each `fits` the live"
        " filter; ratio = rule time / the same snapshot's full placement pass, same process."
        f" Load average at the end: {f(d['machine']['load_avg_1m'], 2)}.",
        "",
        "| fleet | full pass p50 | case | rule p50 / p99 | vs pass | moves | on-demand jobs |",
        "|---|---|---|---|---|---|---|",
    ]
    for scale, run in d["runs"].items():
        for case, c in run["cases"].items():
            out.append(f"| {run['gpus']:,} GPUs ({scale}) | {f(run['full_pass_ms_p50'])} ms | {case} |"
                       f" {f(c['p50_ms'])} / {f(c['p99_ms'])} ms | {f(c['ratio_vs_full_pass'], 2)}x |"
                       f" {c['moves']} | {c['on_demand_running']:,} |")
    return out


def submit_cpu_workers(d: dict[str, Any]) -> list[str]:
    """The same benchmark with one API worker process, its server on grpc.aio
    (``submit_cpu_workers_aio.json``) against the threaded server measured just before it
    in the same tree (``submit_cpu_workers_threads.json``)."""
    return submit_cpu(d, before_name="submit_cpu_workers_threads", title=(
        "### Broker CPU per SubmitJob, one API worker: threads against grpc.aio"
        " (`python benchmarks/bench_submit_cpu.py --set api_workers=1"
        " --set api_worker_server=threads|aio`)"), who=(
        "the broker (`brokerctl serve` and its one API worker process, which serves the"
        " public port; CPU of both"))


def submit_cpu(d: dict[str, Any], before_name: str = "submit_cpu_before",
               title: str = "### Broker CPU per SubmitJob (`python benchmarks/bench_submit_cpu.py`)",
               who: str = "the broker process (`brokerctl serve`") -> list[str]:
    """Broker CPU per SubmitJob (bench_submit_cpu.py): this build, and the build before
    the backlog changes when its JSON (``submit_cpu_before.json``) is committed too."""
    before = load(before_name)
    st = d["setup"]
    out = [
        title,
        "",
        f"CPU time of {who}, SQLite, {st['transport']}) per"
        f" answered SubmitJob of a {st['spec_bytes']:,}-byte spec, {st['clients']} clients,"
        " read from /proc around each phase: robust to the shared machine's load, unlike the"
        " rate. The calibration no-op (`GetJob` with an empty id, refused after TLS and"
        " authentication) runs in the same broker in each run. Median of"
        f" {st['runs']} runs of {st['seconds_per_phase']:g} s per phase. The backlog is pending"
        " jobs written before the broker starts (made by the submit transition, as SubmitJob"
        " makes them); RSS is read once it has loaded them and a warm-up of submits has run"
        " (and, for builds that have it, after the broker's periodic return of freed memory)."
        " Load average at each build's start and end in the last column (2 cores, shared).",
        "",
        "| build | pending | CPU ms / submit | no-op CPU ms | submit / s | p99 ms | vs empty | RSS MB |"
        " KB / pending job | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in (("before", before), ("this", d)):
        if r is None:
            continue
        for n, v in r["backlogs"].items():
            m = v["median"]
            out.append(
                f"| {r.get('label') or label} | {int(n):,} | {f(m['broker_cpu_ms_per_call'], 3)} |"
                f" {f(m['noop_cpu_ms_per_call'], 3)} | {f(m['rate_per_s'], 0)} | {f(m['p99_ms'], 0)} |"
                f" {f(v.get('cpu_ratio_vs_empty', 1.0), 2)} | {v['rss_kb_loaded'] / 1024:,.0f} |"
                f" {f(v['rss_per_pending_kb'], 1) if 'rss_per_pending_kb' in v else '-'} |"
                f" {r['machine']['loadavg_start'][0]:.0f}-{r['machine']['loadavg_end'][0]:.0f} |")
    g = d["goals"]
    p99 = (f" and p99 at most {g['p99_ms']:g} ms" if "p99_ms" in g else "")
    p99_backlog = (f", p99 at most {g['p99_ms_backlog']:g} ms" if "p99_ms_backlog" in g else "")
    rss = (f", at most {g['rss_mb_backlog']:g} MB of RSS" if "rss_mb_backlog" in g else "")
    out += ["", f"Goals: at most {g['broker_cpu_ms_per_submit']} ms of CPU per submit{p99}; at"
            f" 50,000 pending within {g['backlog_ratio']}x of the empty store{p99_backlog}{rss}"
            f" and at most {g['rss_kb_per_pending']:g} KB of RSS per pending job."]
    return out


def submit_cpu_repeat(d: dict[str, Any]) -> list[str]:
    """The empty-store pair again right after the main run, in the reverse order (this
    build first, then the one before it: ``submit_cpu_repeat_before.json``)."""
    return submit_cpu(d, before_name="submit_cpu_repeat_before", title=(
        "### Broker CPU per SubmitJob, the empty store again, order reversed"
        " (`python benchmarks/bench_submit_cpu.py --pending 0`)"))


def submit_stages(d: dict[str, Any]) -> list[str]:
    """Where a SubmitJob's own Python goes (bench_submit_stages.py): thread CPU per stage
    of the composed handler called in process; the build before when
    ``submit_stages_before.json`` is committed too."""
    before = load("submit_stages_before")
    st = d["setup"]
    builds = [(r.get("label") or name, r) for name, r in (("before", before), ("this", d)) if r]
    out = [
        "### Where a SubmitJob's own CPU goes (`python benchmarks/bench_submit_stages.py`)",
        "",
        f"A real broker (TLS config, tokens, audit, {st['store']}) whose composed SubmitJob"
        f" handler is called in process by {st['threads']} threads with each request's wire bytes"
        f" ({st['spec_bytes']:,}-byte specs, {st['submits']:,} submits a run): no gRPC transport,"
        " no TLS record layer, which `bench_submit_cpu.py`'s no-op calibration measures. Each"
        " stage is the calling thread's CPU (`thread_time`, so waits for the group commit or"
        " the GIL are not counted) summed over threads per submit; an indented stage is part"
        " of the nearest less indented one above it; *process* is every thread's CPU per submit with nothing wrapped"
        f" (the calibration of the same run). Median of {st['runs']} runs; microseconds.",
        "",
        "| stage | " + " | ".join(f"{name} us" for name, _ in builds) + " |",
        "|---|" + "---|" * len(builds),
        "| **process CPU per submit** | " + " | ".join(
            f(r["median"]["process_cpu_us_per_submit"], 0) for _, r in builds) + " |",
    ]
    depth = {"": -1}
    for row in d["layout"]:
        label = row["stage"]
        depth[label] = depth[row["part_of"]] + 1
        name = "&nbsp;&nbsp;" * depth[label] + label
        out.append(f"| {name} | " + " | ".join(
            f(r["median"]["stages_us_per_submit"][label], 0) if label in r["median"]["stages_us_per_submit"]
            else "-" for _, r in builds) + " |")
    loads = "; ".join(f"{name} {load_span([r['machine']['loadavg_start'][0], r['machine']['loadavg_end'][0]])}"
                      for name, r in builds)
    out += ["", f"Load average (1 min) at start and end: {loads} (2 cores, shared)."]
    return out


def frontends(d: dict[str, Any]) -> list[str]:
    """SubmitJob rate by API front-end count (bench_frontends.py), with where the CPU went."""
    st = d["setup"]
    out = [
        "### API front-ends on other hosts (`python benchmarks/bench_frontends.py"
        + ("" if "always" in st["store"] else " --appendfsync everysec --no-store-ceiling")
        + "`, as root)",
        "",
        f"`brokerctl serve --frontend` processes, each in its own network namespace, over one"
        f" redis-server ({st['store']}) that shares a namespace with the leader;"
        f" {st['clients']} clients in {st['client_processes']} processes ({st['transport']},"
        f" {st['spec_bytes']:,}-byte specs) spread over the front-ends; the same load for each"
        f" count, 1 front-end the baseline of the same run. Median of {st['runs']} runs of"
        f" {st['seconds_per_phase']:g} s. Cores = CPU seconds per second from /proc; *box* ="
        f" the whole machine's busy cores ({d['machine']['cpus']} in all): every process of"
        " the run and every neighbour's share one machine.",
        "",
        "| front-ends | submit / s | vs 1 | p99 ms | Redis cores | Redis ms / submit |"
        " front-end cores (each) | front-end ms / submit | leader cores | client cores |"
        " box busy cores | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in d["configs"]:
        m = c["median"]
        loads = [r["loadavg_1m_after"] for r in c["runs"]]
        out.append(
            f"| {c['frontends']} | {f(m['rate_per_s'], 0)} | {f(c.get('rate_vs_one', 1.0), 2)} |"
            f" {f(m['p99_ms'], 0)} | {f(m['redis_cores'], 2)} | {f(m['redis_cpu_ms_per_submit'], 3)} |"
            f" {f(m['frontend_cores_each'], 2)} | {f(m['frontend_cpu_ms_per_submit'], 3)} |"
            f" {f(m['leader_cores'], 2)} | {f(m['client_cores'], 2)} | {f(m['box_busy_cores'], 2)} |"
            f" {min(loads):.0f}-{max(loads):.0f} |")
    sa = d.get("store_alone")
    if sa:
        m = sa["median"]
        out += ["", f"Redis alone ({sa['driver']}, straight through the store's group-commit"
                f" path, no API): {f(m['rate_per_s'], 0)} submits/s written at"
                f" {f(m['redis_cores'], 2)} Redis cores, {f(m['redis_cpu_ms_per_submit'], 3)} ms"
                f" of Redis CPU per submit (one full core: ~{f(m['redis_one_core_rate_per_s'], 0)}/s),"
                f" box {f(m['box_busy_cores'], 2)} busy cores."]
    cap = d.get("capacity")
    if cap:
        out += ["", f"Derived from the CPU per submit above (not measured as a rate): with a core"
                f" each, a front-end would take ~{f(cap['rate_per_frontend_core'], 0)} submits/s"
                f" ({f(cap['frontend_cpu_ms_per_submit'], 3)} ms each) and Redis's one thread"
                f" ~{f(cap['redis_one_core_rate'], 0)}/s ({f(cap['redis_cpu_ms_per_submit'], 3)} ms"
                f" each): the rate grows with front-ends up to about"
                f" {f(cap['frontends_to_redis_limit'], 1)} of them, where Redis becomes the limit."]
    return out


def running_redis(d: dict[str, Any]) -> list[str]:
    """bench_running.py on the Redis store with replicas (one round trip and one WAIT a
    write), two runs in one session."""
    return running(d, (), "### Many running jobs on the Redis store with replicas"
                          " (`python benchmarks/bench_running.py --store redis-sentinel`)",
                   ("running_redis_2",))


def load_span(load: list[float]) -> str:
    """A window's 1-minute load average at its start and end, as "a-b"."""
    return f"{load[0]:.0f}-{load[1]:.0f}"


def running(d: dict[str, Any], befores: tuple[str, ...] = ("running_before",),
            title: str = "### Many running jobs (`python benchmarks/bench_running.py`)",
            afters: tuple[str, ...] = ("running_main_sizes", "running_quiet_main")) -> list[str]:
    """The live broker with many running attempts (bench_running.py): this build, and the
    builds it is compared with (``befores``: result files run in the same session, e.g.
    ``running_before.json``, the build before the agent-path changes), rows before it."""
    rows = [(name, r) for name in befores if (r := load(name)) is not None]
    later = [(name, r) for name in afters if (r := load(name)) is not None]
    st = d["setup"]
    out = [
        title,
        "",
        f"A real broker (`brokerctl serve`, {st['store']}) and {st['agents']} fake region agents"
        f" in {st['agent_procs']} processes speaking the real agent stream over mutual TLS with"
        f" agent certificates: {st['nodes']:,} nodes ({st['gpus']:,} GPUs). Each running attempt"
        f" reports progress every {st['report_s']:g} s with {st['log_lines_per_report']} log lines,"
        " and heartbeats list every attempt with its progress, as the real agent's do;"
        f" {f(st['submit_rate'], 0)} submits/s at 10,000 running (the same mean job length at other"
        " sizes) are launched while as many attempts finish. Per size a fresh broker; the smallest"
        f" size is the calibration. Steady window {st['steady_seconds']:g} s. CPU is the broker"
        " process's (all threads, from /proc), in cores; idle = agents connected, no jobs."
        " Visible: send of a JobUpdate to its ack (sent after the commit), to the progress event at"
        f" each of {st['watchers_per_job']} WatchJob streams on each of {st['watched_jobs']} jobs,"
        " and to a GetJob poller (every 100 ms) seeing the step. Load average (1 min) at the"
        " window's start and end in the last column (2 cores, shared).",
        "",
        "| build (window) | running | CPU cores (idle) | RSS MB | ack p50 / p99 ms | watch p50 / p99 ms |"
        " GetJob p99 ms | unacked after | log lines sent / stored | steps behind | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in (*rows, ("this", d), *later):
        for n, v in r["sizes"].items():
            s, vis, sto = v["steady"], v["visible"], v["store"]
            out.append(
                f"| {r.get('label') or label} ({s['seconds']:.0f} s) | {int(n):,} | {f(s['cpu_cores'], 2)}"
                f" ({f(v['idle']['cpu_cores'], 2)}) | {f(s['rss_mb_max'], 0)} |"
                f" {f(vis['update_ack']['p50_ms'], 0)} / {f(vis['update_ack']['p99_ms'], 0)} |"
                f" {f(vis['watch_event']['p50_ms'], 0)} / {f(vis['watch_event']['p99_ms'], 0)} |"
                f" {f(vis['getjob_poll']['p99_ms'], 0)} | {v.get('drain', {}).get('unacked_left', '-'):,} |"
                f" {sto['log_lines_sent']:,} /"
                f" {sto['log_lines_stored']:,} | {sto['jobs_behind_last_sent_step']} |"
                f" {s['loadavg_start'][0]:.0f}-{s['loadavg_end'][0]:.0f} |")
    for _, r in (*rows, ("this", d), *later):  # what each build changed, as its run recorded it
        if r.get("note"):
            out += ["", f"{r.get('label') or 'this'}: {r['note']}"]
    for _, r in (*rows, ("this", d), *later):  # a Redis store's own count of the window's commands
        for n, v in r["sizes"].items():
            calls = v.get("store_calls_per_s")
            if calls:
                shown = ", ".join(f"{k.upper()} {f(calls.get(k, 0), 0)}"
                                  for k in ("wait", "evalsha", "script|exists", "watch", "exec"))
                out += ["", f"{r.get('label') or 'this'} at {int(n):,} running, commands a second at the"
                        f" Redis primary in the window: {shown} ({f(sum(calls.values()), 0)} in all)."]
    reps = d.get("repeats", {})
    for n, runs in reps.items():  # other runs of this build at a size (the row above is one)
        def med(key: str, runs: list = runs) -> str:
            xs = sorted(r[key] for r in runs)
            return f(xs[len(xs) // 2], 0)
        out += ["", f"Repeated runs at {int(n):,} running (this branch's last commits, the table's row last):"
                f" ack p99 {' / '.join(f(r['ack_p99_ms'], 0) for r in runs)} ms (median {med('ack_p99_ms')}),"
                f" watch p99 {' / '.join(f(r['watch_p99_ms'], 0) for r in runs)} ms (median"
                f" {med('watch_p99_ms')}), GetJob p99 {' / '.join(f(r['getjob_p99_ms'], 0) for r in runs)} ms"
                f" (median {med('getjob_p99_ms')}), CPU {' / '.join(f(r['cpu_cores'], 2) for r in runs)}"
                f" cores; load {', '.join(load_span(r['load']) for r in runs)}."]
    if befores != ("running_before",):
        return out
    g = d["goals"]
    out += ["", f"Goals at 10,000 running: broker CPU at most {g['cpu_cores']:g} core, p99"
            f" progress-to-visible at most {g['p99_visible_s']:g} s, every log line stored and"
            " every acknowledged step in the store (steps behind = jobs whose stored step is"
            " older than the last one their agent sent, read from the stopped broker's store;"
            " unacked after = updates still unacknowledged when the agents had stopped reporting"
            " for up to two minutes)."]
    return out


def k8s(d: dict[str, Any]) -> list[str]:
    """The Kubernetes scale benchmark (bench_k8s.py): real control plane, KWOK nodes, the
    real agent process; the polling baseline from the same run."""
    lb, sb, pb = d["launch_to_bound_s"], d["submit_to_bound_s"], d["pods_created_to_bound_s"]
    idle, fill, steady, base = d["agent_idle"], d["agent_fill"], d["agent_steady"], d["baseline_polling"]
    tune = d["cluster_tuning"]
    cp_steady = d.get("control_plane_steady_cpu_fraction_of_core", {})
    g = d["goals"]
    fr = d["agent_requests_during_fill"]
    # one Service per attempt (the agent makes the pods); a Job per attempt in results of
    # the executor before that
    launched = fr.get("create services", 0) if "create jobs" not in fr else fr["create jobs"]
    launch_reqs = sum(v for k, v in fr.items() if k.split()[0] in ("create", "patch"))
    if "launch_to_pods_created_s" in d:  # the agent makes the pods
        lc = d["launch_to_pods_created_s"]
        stages = [f"| of which: Launch -> its pods created (the agent's creates), p50 / p99 |"
                  f" {f(lc['p50'], 2)} / {f(lc['p99'], 2)} s |"]
    else:  # an indexed Job made them
        jb, jc = d["job_created_to_bound_s"], d["job_created_to_pods_created_s"]
        stages = [f"| of which: Job created -> all pods bound, p50 / p99 | {f(jb['p50'], 2)} / {f(jb['p99'], 2)} s |",
                  f"| of which: Job created -> its pods created (Job controller), p50 / p99 |"
                  f" {f(jc['p50'], 2)} / {f(jc['p99'], 2)} s |"]
    rate = d.get("launches_reaching_cluster") or {}
    rate_row = ([f"| Launches reaching the cluster (the agent's Service creates): rate, longest pause |"
                 f" {f(rate['per_s'], 1)}/s over {f(rate['span_s'], 0)} s, {f(rate['max_gap_s'], 1)} s |"]
                if rate.get("per_s") is not None else [])
    bound = (f" {d['jobs_bound']:,} of the {d['jobs']:,} jobs had every pod bound before the"
             " fill's time limit; the figures are theirs." if not d.get("all_bound", True) else "")
    fill_reqs = ", ".join(f"{k} {v:,}" for k, v in sorted(d["agent_requests_during_fill"].items()))
    steady_reqs = ", ".join(f"{k} {v:,}" for k, v in sorted(d["agent_requests_steady"].items())) or "none"
    probe_rows, stage_table = k8s_stages(d)
    note = f" {d['note']}" if d.get("note") else ""
    return [
        f"### Kubernetes scale, {d['nodes']:,} nodes{', ' + d['label'] if d.get('label') else ''}"
        " (`python benchmarks/bench_k8s.py`)",
        "",
        f"A real control plane (etcd, kube-apiserver with audit, controller manager, scheduler),"
        f" KWOK keeping {d['nodes']:,} fake 8-GPU nodes Ready, a real broker and the real agent"
        f" process (`brokerctl agent --executor kubernetes`, as the agent's service account);"
        f" {d['jobs']:,} two-pod jobs ({d['pods']:,} pods, which keep running) submitted at"
        f" {f(d['rate_per_s'], 0)}/s. Node heartbeats are Leases of {tune['node_lease_s']} s"
        f" (KWOK's scale setting: the kubelet's intervals x {f(tune['heartbeat_factor'], 0)}) and the"
        " controller manager's and scheduler's client rate limits are raised; nothing in the agent"
        f" is tuned. Load average before / after: {' / '.join(f(x, 2) for x in d['load_before'])}"
        f" -> {' / '.join(f(x, 2) for x in d['load_after'])} (2 cores, shared)." + bound + note,
        "",
        "| measure | value |",
        "|---|---|",
        f"| agent start-up (process start -> {d['nodes']:,} nodes registered: list + watch) |"
        f" {f(d['agent_startup_s'], 2)} s |",
        *probe_rows,
        f"| fill: Launch -> all pods bound (the agent's first request -> the last binding, audit log), p50 / p99 / max |"
        f" {f(lb['p50'], 2)} / {f(lb['p99'], 2)} / {f(lb['max'], 2)} s (n = {lb['n']:,}) |",
        *stages,
        f"| of which: pods created -> bound (scheduler), p50 / p99 | {f(pb['p50'], 2)} / {f(pb['p99'], 2)} s |",
        *rate_row,
        f"| submit -> all pods bound (adds the broker and the Launch), p50 / p99 |"
        f" {f(sb['p50'], 2)} / {f(sb['p99'], 2)} s |",
        f"| agent CPU: idle over the nodes (baseline) / during the fill / steady state |"
        f" {idle['cpu_fraction_of_core']:.1%} / {fill['cpu_fraction_of_core']:.1%} /"
        f" {steady['cpu_fraction_of_core']:.1%} of a core |",
        f"| agent RSS: idle / steady | {f(idle['rss_mb'], 0)} / {f(steady['rss_mb'], 0)} MB |",
        f"| agent API requests per launched attempt (audit log: creates and patches) |"
        f" {f(launch_reqs / max(1, launched), 2)} ({launched:,} attempts launched) |",
        f"| agent API requests in {f(steady['seconds'], 0)} s of steady state | {steady_reqs} |",
        f"| API server CPU in steady state, agent watching | "
        f"{cp_steady.get('kube-apiserver', float('nan')):.1%} of a core |",
        *([f"| polling baseline | failed: {base['error']} |"] if "error" in base else [
            f"| polling baseline ({base['what']}): list time p50, size | {f(base['list_s']['p50'], 2)} s,"
            f" {f(base['mb_per_list'], 1)} MB ({f(base['requests_per_s'], 2)} lists/s achieved) |",
            f"| polling baseline: poller CPU / API server CPU | {base['poller_cpu_fraction_of_core']:.1%} /"
            f" {base['apiserver_cpu_fraction_of_core']:.1%} of a core |"]),
        "",
        f"Agent requests during the fill: {fill_reqs}."
        + (" The `get pods` are `pods/log` reads: KWOK's nodes serve no logs, so each pod's"
           " read fails; "
           + ("after four failures in a row the pod's reader is parked until its container ends."
              if tune.get("kwok_parallelism") else
              "it was retried with backoff (1 s doubling to a minute) for the pod's whole life.")
           if fr.get("get pods", 0) else "")
        + (f" The agent self-fenced {d['agent_self_fences']} time(s) (no broker answer within its"
           " deadline): the deletes are its kills, and the steady window's creates and patches are"
           " the broker's relaunches, so that window was not idle." if d.get("agent_self_fences") else "")
        + (f" The agent registered {d['agent_registrations']} time(s) (1: it never lost its stream)."
           if "agent_registrations" in d else ""),
        "",
        *stage_table,
        *k8s_agent_profile(d),
        f"Goals: Launch -> bound p99 <= 2 s: {'met' if g['launch_to_bound_p99_le_2s'] else 'missed'};"
        f" agent steady-state CPU <= 10% of a core: {'met' if g['agent_steady_cpu_le_10pct'] else 'missed'}.",
    ]


def k8s_agent_profile(d: dict[str, Any], top: int = 6) -> list[str]:
    """With ``--profile-agent``: where the steady agent's samples were, its busiest
    functions (threads waiting on a condition left out: they are idle, not work)."""
    prof = d.get("agent_profile_steady") or {}
    idle = ("Condition.wait", "Event.wait", "StopSignals.wait", "channel_spin")
    busy = [(name, share) for name, share in prof.get("self") or []
            if not name.startswith(idle) and "channel_spin" not in name][:top]
    if not busy:
        return []
    listed = "; ".join(f"{name} {share:.1%}" for name, share in busy)
    return [f"The steady agent's busiest functions (py-spy, {prof.get('samples', 0):,} samples over all"
            f" threads, share of samples on top of the stack): {listed}.", ""]


def k8s_stages(d: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The probe's headline rows (launches one at a time into the full cluster) and the
    table of where Launch -> bound goes, stage by stage, for the fill and the probe
    (results from before the breakdown have neither)."""
    pr = d.get("probe") or {}
    fs, ps = d.get("fill_stages") or {}, pr.get("stages") or {}
    rows = []
    if ps.get("attempts"):
        a, r = ps["admitted_to_bound"], ps["agent_received_to_bound"]
        rows = [f"| probe ({pr['jobs']} launches at {f(pr['rate_per_s'], 1)}/s into the full cluster,"
                f" {pr['pods_bound_before']:,} pods bound): broker's Launch decision -> all pods bound,"
                f" p50 / p99 / max | {f(a['p50'], 2)} / {f(a['p99'], 2)} / {f(a['max'], 2)} s"
                f" (n = {a['n']}) |",
                f"| probe: the agent took the Launch -> all pods bound, p50 / p99 |"
                f" {f(r['p50'], 2)} / {f(r['p99'], 2)} s |"]
    if not fs.get("attempts") and not ps.get("attempts"):
        return rows, []
    keys = [k for k in fs if isinstance(fs.get(k), dict) and "what" in fs[k]] or \
        [k for k in ps if isinstance(ps.get(k), dict) and "what" in ps[k]]

    def cell(st: dict[str, Any], k: str) -> str:
        v = st.get(k) or {}
        return f"{f(v['p50'], 2)} / {f(v['p99'], 2)}" if v.get("n") else "-"

    table = ["Where Launch -> bound goes, per attempt, p50 / p99 in seconds (host clock: the"
             " broker's events, the agent's log, the API server's audit log):", "",
             f"| stage | fill ({fs.get('attempts', 0):,} attempts) | probe ({ps.get('attempts', 0):,}) |",
             "|---|---|---|"]
    table += [f"| {(fs.get(k) or ps.get(k))['what']} | {cell(fs, k)} | {cell(ps, k)} |" for k in keys]
    return rows, [*table, ""]


def node_deltas(d: dict[str, Any]) -> list[str]:
    """A node's health flipping: the changed partitions rebuilt vs the whole capacity
    index rebuilt (bench_node_deltas.py), both in one run."""
    names = {"kubernetes_scale": "Kubernetes scale fleet", "placement": "placement benchmark fleet"}
    out = [
        "### Node changes in the scheduler's capacity index (`python benchmarks/bench_node_deltas.py`)",
        "",
        f"A node's health flipped {d['flips']} times per fleet; each time, the next pass's preparation of"
        " the kept-alive capacity index is timed (an empty queue: the pass does nothing else):"
        " the changed node's partitions built again (now) against the whole index built again (before),"
        f" in the same run. Load average before / after: {' / '.join(f(x, 2) for x in d['load_before'])}"
        f" -> {' / '.join(f(x, 2) for x in d['load_after'])} (2 cores, shared).",
        "",
        "| fleet | nodes / running jobs / partitions | partitions rebuilt: median / p90 | whole index: median / p90 |",
        "|---|---|---|---|",
    ]
    for key, r in d["fleets"].items():
        pr, wr = r["partition_rebuild"], r["whole_index_rebuild"]
        out.append(f"| {names.get(key, key)} | {r['nodes']:,} / {r['running']:,} / {r['partitions']} |"
                   f" {f(pr['median_ms'], 1)} / {f(pr['p90_ms'], 1)} ms |"
                   f" {f(wr['median_ms'], 1)} / {f(wr['p90_ms'], 1)} ms |")
    out += ["", "The gain grows with the number of partitions (agents x capacity types x pools): the"
            " Kubernetes fleet has two (on-demand and spot), so half of it is still built again."]
    return out


def memtier(d: dict[str, Any]) -> list[str]:
    """The in-memory recovery tier: snapshot cost per step, recovery vs the store path."""
    la = d.get("load_average_1_5_15_start", ["?"])
    out = [
        "### In-memory recovery tier (`python benchmarks/bench_memtier.py`)",
        "",
        f"Real gloo ranks (one per node), a keeper process per node, {d['machine']}. 1-minute load "
        f"average {f(la[0], 1)} at the start and {f(d.get('load_average_1_5_15_end', ['?'])[0], 1)} "
        "at the end on 2 shared cores: CPU times are inflated and noisy.",
    ]
    for key in sorted(k for k in d if k.startswith("overhead_")):
        o = d[key]
        out += [
            "",
            f"Snapshot cost, model `{o['model']}` + AdamW, {o['ranks']} rank(s), snapshot "
            f"{o['snapshot_bytes_rank0'] / 1e6:,.1f} MB per rank sent to "
            f"{o.get('keepers_per_snapshot', 2)} keeper(s) (each holding {o.get('keeper_keep', 2)} step(s) per "
            f"rank); median of {o['rounds']} rotated round(s) of {o['steps_per_phase']} steps per "
            f"phase. Tier off: {f(o['off_cpu_ms_per_step'], 1)} ms CPU per step (rank 0, all "
            "threads). Goal: at most "
            f"{d['goal']['overhead_at_k1']:.0%} at K=1.",
            "",
            "| snapshot every K steps | rank CPU per step vs off | training thread CPU (small state, "
            "copy or fence) | keepers' CPU (share of a step) | snapshots (skipped) |",
            "|---|---|---|---|---|",
        ]
        for k, v in o["per_k"].items():
            out.append(f"| {k} | {v['cpu_overhead']:+.1%} | {f(v['training_thread_ms_per_step'], 2)} ms "
                       f"({v['training_thread_share']:.1%}) | {v['keepers_cpu_share']:.1%} | "
                       f"{v['snapshots']} ({v['skipped']}) |")
        best = o.get("smallest_k_meeting_goal_cpu")
        out += ["", f"Smallest K within the goal on the rank's CPU (keepers not counted): "
                f"{best if best else 'none measured'}."]
        if o.get("k_for_goal_from_per_snapshot_cost"):
            out.append(f"From the measured cost of one snapshot ({f(o['per_snapshot_cpu_s'], 2)} s of "
                       f"the rank's CPU against {f(o['off_cpu_ms_per_step'] / 1e3, 2)} s per step), "
                       f"the goal is reached at K={o['k_for_goal_from_per_snapshot_cost']}.")
        if o.get("memory"):
            m = o["memory"]
            cg = m.get("cgroup") or {}
            out.append(f"{f(o.get('params', 0) / 1e6, 0)}M parameters. Memory: rank 0 peak RSS "
                       f"{m['peak_rss_mb_rank0']:,} MB, keepers' peak RSS "
                       f"{', '.join(f'{x:,}' for x in m['peak_rss_mb_keepers'])} MB"
                       + (f"; the run's cgroup peak {cg['peak_bytes'] / 2**30:.1f} GiB (page cache "
                          "included)" if cg.get("peak_bytes") else "") + ".")
    for key in sorted(k for k in d if k.startswith("recovery_")):
        out += _recovery_lines(d, d[key])
    for key in sorted(k for k in d if k.startswith("stopped_")):
        st = d[key]
        cg = st.get("cgroup") or {}
        part, _, model = key.removeprefix("stopped_").partition("_")
        seen = [f"{what} {', '.join(f'{x:,}' for x in st[k])} MB" for k, what in (
            ("peak_rss_mb_ranks", "ranks' peak RSS"), ("peak_rss_mb_keepers", "keepers' peak RSS"))
            if st.get(k)]
        if st.get("peak_rss_mb_ranks_max"):
            seen.append(f"a rank's peak RSS {st['peak_rss_mb_ranks_max']:,} MB, a keeper's "
                        f"{st['peak_rss_mb_keepers_max']:,} MB")
        if cg.get("peak_bytes"):
            seen.append(f"the run's cgroup peak {cg['peak_bytes'] / 2**30:.1f} GiB")
        out += ["", f"Not measured: the {part} part with model `{model}` ({st.get('measured', '?')}, "
                f"1-minute load average {f(st['load_average_1_5_15'][0], 1)}) {st['reason']}"
                + (f" ({', '.join(seen)})" if seen else "") + "."]
    return out


STAGE_TEXT = {
    "notice": "the agent sees the dead rank, stops the survivors",
    "report": "its update reaches the broker",
    "decide_admit": "recovery plan and admission (same pass)",
    "launch": "Launch to the agent, prepare, spawn or fork",
    "imports": "interpreter, torch, the script's imports",
    "process_group": "rendezvous (waits for the slowest rank), mesh",
    "setup": "the script: model, FSDP, optimizer, tier",
    "restore": "the restore (memory or store), agreed",
    "first_step": "the first step",
}


def _recovery_lines(d: dict[str, Any], r: dict[str, Any]) -> list[str]:
    """The recovery part: downtime per path and where it goes, stage by stage."""
    runs = r.get("runs") or {"": r}
    out = [
        "",
        (f"**{r['label']}.** " if r.get("label") else "")
        + f"Recovery after a node kill: {r['method']}. "
        f"`{r['model']}`, {r['nodes']} nodes x 1 rank, durable checkpoint every "
        f"{r['checkpoint_every']} steps (local store), node 1 killed "
        f"{r['kill_offset_after_checkpoint']} steps after one; {r['kills_per_path']} kill(s) "
        "per path alternating on one job (memory: node 1's rank and keeper lost; store: "
        "node 2's keeper too, so rank 1's both copies are gone). Medians per stage (the upper "
        "middle value of an even count), seconds"
        + ("; a tiny model, so the store's read is cheap here and the memory path's gain is the "
           "lost steps:" if not r.get("params") else
           f"; {r['params'] / 1e6:,.0f}M parameters + AdamW, keepers holding "
           f"{r.get('keeper_keep', 2)} step(s) per rank:"),
        "",
    ]
    cols = [(name, run, path) for name, run in runs.items() for path in ("memory", "store")]
    head = " | ".join(f"{(name + ': ') if name else ''}{path}" for name, _, path in cols)
    out += [f"| stage | {head} |", "|---|" + "---|" * len(cols)]
    for stage in r["stages"]:
        vals = " | ".join(f(x, 2) if (x := run[path]["stages_s_median"].get(stage)) is not None
                          else "-" for _, run, path in cols)
        out.append(f"| {stage} ({STAGE_TEXT.get(stage, '')}) | {vals} |")
    vals = " | ".join(f"**{f(run[path]['downtime_s_median'], 2)}**" for _, run, path in cols)
    out.append(f"| downtime (kill to the first step) | {vals} |")
    vals = " | ".join(f"{f(run[path]['lost_steps_median'], 0)} ({run[path]['lost_steps_max']})"
                      for _, run, path in cols)
    out.append(f"| lost steps, median (max) | {vals} |")
    out.append("")
    for name, run in runs.items():
        la = run.get("load_average_1_during") or []
        when = f" (measured {run['measured']})" if run.get("measured") else ""
        out.append(f"- {name or 'run'}{when}: downtime ratio memory/store "
                   f"{f(run['downtime_ratio'], 2)} (goal <= {d['goal']['downtime_ratio']}); "
                   f"1-minute load average {', '.join(f(x, 1) for x in la) or '?'} at the kills.")
        if run.get("memory_use"):
            m, cg = run["memory_use"], r.get("cgroup") or {}
            bound = (f" (its bound: {r.get('keeper_keep', 2)} snapshot(s) of each of the 2 ranks it "
                     f"serves, the arriving one included, {m['snapshot_mb_rank0']:,} MB each: "
                     f"{m['keeper_bound_mb']:,} MB)" if m.get("keeper_bound_mb") else "")
            out.append(f"- memory: peak RSS of a rank {m['peak_rss_mb_ranks_max']:,} MB, of a keeper "
                       f"{m['peak_rss_mb_keepers_max']:,} MB{bound}"
                       + (f", the run's cgroup peak {cg['peak_bytes'] / 2**30:.1f} GiB (page cache "
                          "included)" if cg.get("peak_bytes") else "")
                       + f"; the machine's lowest MemAvailable {f(m['min_mem_available_gb'], 1)} GB.")
        for smp in run.get("samples", []):
            tier = smp.get("memory_tier_at_kill") or {}
            if not tier:
                continue
            out.append(f"- {smp['path']} kill: after step {smp['killed_after_step']}, resumed at "
                       f"{smp['resumed_step']} ({smp['lost_steps']} lost); before the kill rank 0 "
                       f"had taken {tier.get('taken', '?')} snapshot(s) every "
                       f"{tier.get('every', '?')} step(s) and skipped {tier.get('skipped', '?')} "
                       "(the previous one still sending on some rank)"
                       + (f"; the job's event: \"{smp['event']}\"." if smp.get("event") else "."))
            laps = smp.get("restore_laps_s") or {}
            if laps:  # where rank 0's restore from the keepers went (trainer/memtier.py)
                moved = smp.get("restore_bytes") or {}
                out.append(f"  Rank 0's restore: {', '.join(f'{k} {f(v, 2)} s' for k, v in laps.items())}"
                           + (f"; {moved['read'] / 1e6:,.0f} MB read, "
                              f"{moved['direct'] / 1e6:,.0f} MB of it straight into the live tensors"
                              if moved.get("read") else "")
                           + (f"; a steady step before the kill took {f(smp['steady_step_s_before_kill'], 1)} s"
                              if smp.get("steady_step_s_before_kill") else "") + ".")
    return out


def render() -> str:
    lines = [
        BEGIN,
        "Figures below are generated from `benchmarks/results/*.json` by "
        "`python benchmarks/summarize.py --docs`; each benchmark prints them and writes its JSON. "
        "All were measured on this project's 2-core, no-GPU machine, often shared with other work, "
        "so treat small differences as noise.",
        "",
    ]
    for name, fn in (("placement", placement), ("api", api), ("checkpoint", checkpoint), ("hash", digests),
                     ("proactive", proactive_rules), ("migration", migration), ("mbb", mbb),
                     ("transfer", transfer), ("store", store), ("store_failover", store_failover),
                     ("store_failover_broker", store_failover_broker),
                     ("store_failover_write_group", store_failover_write_group),
                     ("store_failover_broker_quiet", store_failover_broker),
                     ("library", library), ("memtier", memtier),
                     ("workdir", workdir), ("unpack", unpack), ("auth", auth), ("peer_gate", peer_gate), ("streams", streams),
                     ("submit_cpu", submit_cpu), ("submit_cpu_workers_aio", submit_cpu_workers),
                     ("submit_cpu_repeat", submit_cpu_repeat), ("submit_stages", submit_stages),
                     ("frontends", frontends),
                     ("frontends_everysec", frontends), ("running", running), ("running_redis", running_redis),
                     ("k8s", k8s), ("k8s_idle_passes_first", k8s), ("k8s_profile_before_idle_passes", k8s), ("k8s_before_idle_passes", k8s), ("k8s_before_node_watch", k8s), ("k8s_400", k8s), ("k8s_400_6threads", k8s),
                     ("node_deltas", node_deltas),
                     ("console", console), ("usage_series", usage_series), ("sim", sim)):
        d = load(name)
        if d is not None:
            lines += [*fn(d), ""]
    for path in sorted(RESULTS.glob("chaos_*.json")):
        lines += [*chaos(json.loads(path.read_text())), ""]
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--docs" in argv:
        readme = ROOT / "docs" / "benchmarks.md"
        s = readme.read_text()
        if BEGIN in s and END in s:
            s = s[: s.index(BEGIN)] + text + s[s.index(END) + len(END):]
        elif "<!-- BENCHMARKS -->" in s:
            s = s.replace("<!-- BENCHMARKS -->", text)
        else:
            raise SystemExit("docs/benchmarks.md has no benchmark markers")
        readme.write_text(s)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
