"""Kubernetes scale benchmark: the region agent's kubernetes executor on a real control plane
with KWOK's 2,000 fake GPU nodes and 5,000 running pods.

A real kube-apiserver / etcd / controller manager / scheduler (tests/fixtures/k8s, built
from the Go module proxy), KWOK keeping 2,000 nodes with the real EKS labels Ready and
walking pods to Running (nothing runs in them), a real broker (TLS, SQLite) and the real
agent process (``brokerctl agent --executor kubernetes``) authenticated as the service
account of ``deploy/k8s/agent.yaml``. The API server audits that service account, so the
agent's requests are counted server-side.

Measured:
* agent start-up: process start -> its 2,000 nodes registered with the broker (list and
  watch set up, imports included);
* Launch -> all pods bound, per attempt: the benchmark's own watch sees the attempt's Job
  created, then each of its pods with a node (the real scheduler's binding); p50/p99, at
  a submit rate of ``--rate`` jobs/s until ``--jobs`` 2-pod jobs (5,000 pods) run;
* the agent's CPU and RSS (from /proc) during the fill and over ``--steady`` seconds of
  steady state with every pod running; the baseline is the same agent over the same
  2,000 nodes with no pods (idle), measured first in the same run;
* API requests by the agent per attempt (audit log), by verb: watches, not polling.

Goals (issue text): Launch -> bound p99 <= 2 s at this size; agent steady-state CPU <= 10%
of a core. Writes benchmarks/results/k8s.json.

    .venv/bin/python benchmarks/bench_k8s.py [--nodes 2000] [--jobs 2500] [--rate 20] [--steady 60]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "proto")]
RESULTS = REPO / "benchmarks" / "results" / "k8s.json"
AGENT_SA = ("computebroker", "region-agent")  # deploy/k8s/agent.yaml
NAMESPACE = "training"
REGION = "us-east-2"
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_rss(pid: int) -> tuple[float, int]:
    """CPU seconds (user+system) and RSS bytes of ``pid`` and its children threads."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    cpu = (int(parts[11]) + int(parts[12])) / TICKS
    with open(f"/proc/{pid}/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return cpu, rss


def cpu_share(pid: int, seconds: float) -> dict[str, float]:
    c0, _ = proc_cpu_rss(pid)
    t0 = time.monotonic()
    time.sleep(seconds)
    c1, rss = proc_cpu_rss(pid)
    return {"cpu_fraction_of_core": round((c1 - c0) / (time.monotonic() - t0), 4),
            "rss_mb": round(rss / 2**20, 1), "seconds": seconds}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 3) if xs else float("nan")


class BindWatch:
    """Our own observer: Job ADDED time and the time each of its pods got a node."""

    def __init__(self, cp: Any) -> None:
        from kubernetes import client

        self.api = client.ApiClient(cp.api_client().configuration)
        self.created: dict[str, float] = {}
        self.bound: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._jobs, daemon=True),
                         threading.Thread(target=self._pods, daemon=True)]
        for t in self._threads:
            t.start()

    def _jobs(self) -> None:
        from kubernetes import client, watch

        batch = client.BatchV1Api(self.api)
        while not self._stop.is_set():
            for ev in watch.Watch().stream(batch.list_namespaced_job, NAMESPACE, timeout_seconds=30):
                if ev["type"] == "ADDED":
                    self.created.setdefault(ev["object"].metadata.name, time.monotonic())

    def _pods(self) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(self.api)
        while not self._stop.is_set():
            for ev in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, timeout_seconds=30):
                pod = ev["object"]
                job = (pod.metadata.labels or {}).get("job-name") or \
                    (pod.metadata.labels or {}).get("batch.kubernetes.io/job-name")
                if job and pod.spec.node_name:
                    self.bound.setdefault(job, {}).setdefault(pod.metadata.name, time.monotonic())

    def latencies(self, pods_per_job: int) -> list[float]:
        out = []
        for job, t0 in self.created.items():
            b = self.bound.get(job, {})
            if len(b) >= pods_per_job:
                out.append(max(b.values()) - t0)
        return out

    def stop(self) -> None:
        self._stop.set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2500, help="2-pod jobs (pods = 2 x jobs)")
    ap.add_argument("--rate", type=float, default=20.0, help="submits per second")
    ap.add_argument("--steady", type=float, default=60.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()

    from computebroker.v1 import common_pb2 as pb
    from tests.fixtures.cluster import Cluster, wait_until
    from tests.fixtures.k8s.controlplane import ControlPlane
    from tests.fixtures.k8s.kubelet import NodeSpec
    from tests.fixtures.k8s.kwok import Kwok
    from tests.fixtures.pki import install

    install()  # a development CA; CB_CA / CB_TOKEN of the bootstrap operator for the SDK
    load_before = os.getloadavg()
    sa_user = f"system:serviceaccount:{AGENT_SA[0]}:{AGENT_SA[1]}"
    root = Path(tempfile.mkdtemp(prefix="cb-bench-k8s-"))
    cp = ControlPlane(name="bench", root=root / "k8s", audit_users=(sa_user,)).start()
    kwok = Kwok(cp).start()
    c = Cluster(root=root / "cb")
    out: dict[str, Any] = {"benchmark": "k8s", "nodes": args.nodes, "jobs": args.jobs,
                           "pods": 2 * args.jobs, "rate_per_s": args.rate,
                           "host": platform.node(), "cpus": os.cpu_count(),
                           "load_before": [round(x, 2) for x in load_before]}
    try:
        t = time.monotonic()
        kwok.add_nodes([NodeSpec(name=f"gpu-{i:05d}", region=REGION, zone=f"{REGION}{'abc'[i % 3]}",
                                 gpus=8, layers=(f"l1-{i // 512}", f"l2-{i // 128}", f"l3-{i // 16}"),
                                 ultraserver=f"us-{i // 18}" if i % 4 == 0 else "",
                                 capacity_type=("ON_DEMAND", "SPOT")[i % 2])
                        for i in range(args.nodes)], workers=16)
        out["node_create_s"] = round(time.monotonic() - t, 2)
        import yaml

        for name in ("namespace.yaml", "agent.yaml"):
            cp.apply_manifests([d for d in yaml.safe_load_all((REPO / "deploy/k8s" / name).read_text()) if d])
        kubeconfig = cp.kubeconfig_for_service_account(*AGENT_SA)
        c.extra_env["KUBECONFIG"] = str(kubeconfig)
        c.start_broker()
        with c.client() as client:
            client.set_team_quota(team="bench", guaranteed_gpus=8 * args.nodes)
        t_agent = time.monotonic()
        agent = c.start_agent(REGION, "--executor", "kubernetes", "--namespace", NAMESPACE)
        with c.client() as client:
            wait_until(lambda: agent.alive() and _region_gpus(client, REGION) >= 8 * args.nodes,
                       timeout=300, what=f"agent registered\n{agent.tail()}")
        out["agent_startup_s"] = round(time.monotonic() - t_agent, 2)
        pid = agent.popen.pid
        out["agent_idle"] = cpu_share(pid, min(args.steady, 30))
        audit0 = len(cp.audited_requests())
        watch = BindWatch(cp)
        t_fill = time.monotonic()
        c_fill0, _ = proc_cpu_rss(pid)
        with c.client() as client:
            for i in range(args.jobs):
                client.submit(pb.JobSpec(name=f"kwok-{i}", team="bench", command=["sleep", "1d"],
                                         resources=pb.Resources(nodes=2, gpus_per_node=2)))
                lag = t_fill + (i + 1) / args.rate - time.monotonic()
                if lag > 0:
                    time.sleep(lag)
        wait_until(lambda: len(watch.latencies(2)) >= args.jobs, timeout=600,
                   what=f"{args.jobs} jobs bound ({len(watch.latencies(2))})\n{agent.tail()}")
        c_fill1, rss = proc_cpu_rss(pid)
        fill_s = time.monotonic() - t_fill
        lat = watch.latencies(2)
        out["launch_to_bound_s"] = {"p50": pct(lat, 50), "p99": pct(lat, 99),
                                    "max": round(max(lat), 3), "n": len(lat),
                                    "mean": round(statistics.fmean(lat), 3)}
        out["agent_fill"] = {"cpu_fraction_of_core": round((c_fill1 - c_fill0) / fill_s, 4),
                             "rss_mb": round(rss / 2**20, 1), "seconds": round(fill_s, 1)}
        reqs = cp.audited_requests()[audit0:]
        verbs = Counter(r.get("verb", "?") for r in reqs)
        out["agent_requests_during_fill"] = dict(verbs)
        out["agent_requests_per_attempt"] = round(len(reqs) / max(1, args.jobs), 2)
        audit1 = len(cp.audited_requests())
        out["agent_steady"] = cpu_share(pid, args.steady)
        steady = cp.audited_requests()[audit1:]
        out["agent_requests_steady"] = dict(Counter(r.get("verb", "?") for r in steady))
        out["agent_requests_steady_per_s"] = round(len(steady) / args.steady, 2)
        watch.stop()
    finally:
        out["load_after"] = [round(x, 2) for x in os.getloadavg()]
        c.stop()
        kwok.stop()
        cp.stop()
    out["goals"] = {
        "launch_to_bound_p99_le_2s": out.get("launch_to_bound_s", {}).get("p99", 99) <= 2.0,
        "agent_steady_cpu_le_10pct": out.get("agent_steady", {}).get("cpu_fraction_of_core", 1) <= 0.10,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


def _region_gpus(client: Any, region: str) -> int:
    """Total GPUs the broker sees in ``region`` (ListRegions)."""
    return sum(r.total_gpus for r in client.regions() if r.name == region)


if __name__ == "__main__":
    sys.exit(main())
