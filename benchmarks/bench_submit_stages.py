"""Where a SubmitJob's own Python goes: thread CPU per stage, in process, no transport.

Why in process: ``bench_submit_cpu.py`` reads the broker's whole CPU per call from
/proc (gRPC, TLS and our code together) and its no-op calibration says what the
transport and authentication cost any call; this one attributes the rest. A real
broker (``BrokerServer``: TLS config, dev PKI tokens, SQLite in a temp dir, audit,
the call pipeline) is started, and its composed SubmitJob handler (auth, edge,
standby gate, servicer) is called directly by ``--threads`` threads with the
request's wire bytes, as gRPC's thread pool would call it, ~3.5 KB specs (the
same as bench_submit_cpu.py).

Each stage is wrapped, for the measurement only, in a timer of the calling thread's
CPU (``time.thread_time``: waiting for the group commit or the GIL is not counted),
summed over all threads and divided by the submits. Stages nest (``LAYOUT``: each
with the stage it is part of); the wrappers themselves add ~1 us each. The
calibration in the same run: the process's CPU per submit (``process_time``, every
thread) with no stage wrapped. Median of ``--runs`` runs; load recorded.

    .venv/bin/python benchmarks/bench_submit_stages.py [--submits 3000] [--threads 8]
        [--runs 3] [--out benchmarks/results/submit_stages.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "proto")]

from benchmarks.bench_submit_cpu import spec  # noqa: E402
from broker.api import edge, jobs_service, pipeline  # noqa: E402
from broker.auth import audit, interceptor  # noqa: E402
from broker.auth.devca import create_dev_pki  # noqa: E402
from broker.auth.identity import Role  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.jobs import applier, ops, transitions  # noqa: E402
from broker.server import BrokerServer  # noqa: E402
from broker.store import sqlite  # noqa: E402
from computebroker.v1 import capacity_pb2 as cpb  # noqa: E402
from computebroker.v1 import jobs_pb2 as jpb  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "submit_stages.json"
SUBMIT = "/computebroker.v1.JobService/SubmitJob"

ALL = "all of a submit (the calling threads)"
DECODE = "request decode (wire bytes to a checked message)"
HANDLER = "handler (auth, edge gate, servicer)"
ENCODE = "response encode"
GROUP = "group commit (store write, audit rider, after-commit)"
AUTH = "auth: authenticate + authorize"
# (owner, attribute, label, part of): the stages timed, in the order shown. Each is
# wrapped where its caller looks it up (``edge.check_message``: the edge's own name
# for it, so the check's recursive calls are not counted twice).
STAGES: list[tuple[Any, str, str, str]] = [
    (edge, "check_message", "edge limits (check_message)", DECODE),
    (interceptor.AuthInterceptor, "_admit", AUTH, HANDLER),
    (interceptor.Authenticator, "authenticate", "token verification", AUTH),
    (ops.JobOps, "_admissible", "spec checks (validate_spec, team, feasibility)", HANDLER),
    (transitions, "submit", "submit transition (the new job and its event)", HANDLER),
    (applier.Applier, "create", GROUP, HANDLER),
    (sqlite.SQLiteStore, "_write_group", "SQLite transaction (its leader's CPU, per submit)", GROUP),
    (audit.PendingAudit, "rider", "audit record", GROUP),
    (applier.Applier, "_committed", "after commit: hot jobs, listeners, hub, wake-up", GROUP),
    (jobs_service, "visible", "visible (env redaction check)", HANDLER),
]


def _layout() -> list[tuple[str, str]]:
    """Every label with the one it is part of, depth first (the order shown)."""
    children: dict[str, list[str]] = {ALL: [DECODE, HANDLER, ENCODE]}
    for _, _, label, parent in STAGES:
        children.setdefault(parent, []).append(label)
    out: list[tuple[str, str]] = []

    def walk(label: str, parent: str) -> None:
        out.append((label, parent))
        for child in children.get(label, []):
            walk(child, label)

    walk(ALL, "")
    return out


LAYOUT = _layout()


class StageClock:
    """Sums the calling thread's CPU time per stage label, across threads."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self.on = False

    def add(self, label: str, seconds: float) -> None:
        with self._lock:
            self.total[label] += seconds

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            if not self.on:
                return fn(*a, **kw)
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.add(label, time.thread_time() - t0)
        return timed


class Ctx:
    """What the composed handler asks of gRPC's servicer context (a token caller)."""

    def __init__(self, token: str) -> None:
        self._md = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> tuple:
        return self._md

    def peer(self) -> str:
        return "ipv4:127.0.0.1:40000"

    def auth_context(self) -> dict:
        return {}

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"aborted: {code} {details}")

    def set_code(self, code: Any) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def time_remaining(self) -> float:
        return 30.0


@contextlib.contextmanager
def broker(tmp: Path) -> Iterator[tuple[Any, dict[str, str]]]:
    """A started BrokerServer and its composed method table (the layered handlers)."""
    layered: list[pipeline.LayeredServer] = []
    init = pipeline.LayeredServer.__init__

    def capture(self: pipeline.LayeredServer, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        layered.append(self)

    pipeline.LayeredServer.__init__ = capture  # type: ignore[method-assign]
    pki = create_dev_pki(tmp / "pki", agents=[],
                         users=[("op", Role.OPERATOR, ""), ("bench", Role.MEMBER, "ml")])
    cfg = BrokerConfig(listen="127.0.0.1:0", agent_listen="127.0.0.1:0",
                       store=f"sqlite:///{tmp / 'broker.sqlite'}",
                       checkpoint_root=str(tmp / "ckpt"), **dict(pki.broker_settings))
    srv = BrokerServer(cfg)
    srv.start()
    pipeline.LayeredServer.__init__ = init  # type: ignore[method-assign]
    try:
        methods = layered[0].methods
        methods["/computebroker.v1.CapacityService/SetTeamQuota"].unary_unary(
            cpb.SetTeamQuotaRequest(quota=cpb.TeamQuota(
                team="ml", quotas=[cpb.QuotaEntry(guaranteed_gpus=8)])), Ctx(pki.tokens["op"]))
        yield methods, pki.tokens
    finally:
        srv.stop(0)


def one_run(submits: int, threads: int, clock: StageClock, timed: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-submit-stages-") as tmp, \
            broker(Path(tmp)) as (methods, tokens):
        h = methods[SUBMIT]
        decode = clock.wrap(DECODE, h.request_deserializer)
        handle = clock.wrap(HANDLER, h.unary_unary)
        encode = clock.wrap(ENCODE, h.response_serializer)
        ctx = Ctx(tokens["bench"])
        rng = random.Random(7)
        wire = [jpb.SubmitJobRequest(spec=spec(i, rng), client_request_id=f"r-{i}").SerializeToString()
                for i in range(submits + 200)]

        def call(b: bytes) -> bytes:
            return encode(handle(decode(b), ctx))

        for b in wire[:200]:  # warm-up: caches, the team record, the token
            call(b)
        work = wire[200:]

        def run(chunk: list[bytes]) -> None:
            t0 = time.thread_time()
            for b in chunk:
                call(b)
            if clock.on:
                clock.add(ALL, time.thread_time() - t0)

        clock.total.clear()
        clock.on = timed
        gc.collect()
        p0, w0 = time.process_time(), time.monotonic()
        pool = [threading.Thread(target=run, args=(work[i::threads],)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        cpu, wall = time.process_time() - p0, time.monotonic() - w0
        clock.on = False
        out = {"process_cpu_us_per_submit": round(cpu * 1e6 / submits, 1),
               "submits_per_s": round(submits / wall, 0), "loadavg_1m": os.getloadavg()[0]}
        if timed:
            out["stages_us_per_submit"] = {label: round(clock.total.get(label, 0.0) * 1e6 / submits, 1)
                                           for label, _ in LAYOUT}
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--submits", type=int, default=3000)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--label", default="")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)

    clock = StageClock()
    for owner, attr, label, _ in STAGES:
        fn = getattr(owner, attr)
        if isinstance(owner, type) and isinstance(owner.__dict__.get(attr), staticmethod):
            setattr(owner, attr, staticmethod(clock.wrap(label, fn)))
        else:
            setattr(owner, attr, clock.wrap(label, fn))

    result: dict[str, Any] = {
        "benchmark": "submit_stages", "label": args.label,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": list(os.getloadavg())},
        "setup": {"submits": args.submits, "threads": args.threads, "runs": args.runs,
                  "spec_bytes": len(spec(0, random.Random(1)).SerializeToString()),
                  "store": "sqlite (WAL, synchronous=FULL)",
                  "what": "the composed SubmitJob handler called directly (no gRPC transport)"},
        "runs": [],
    }
    for r in range(args.runs):
        plain = one_run(args.submits, args.threads, clock, timed=False)
        staged = one_run(args.submits, args.threads, clock, timed=True)
        result["runs"].append({"calibration": plain, "staged": staged})
        print(f"run {r + 1}: {plain['process_cpu_us_per_submit']:.0f} us process CPU per submit"
              f" unwrapped, {staged['process_cpu_us_per_submit']:.0f} wrapped;"
              f" load {plain['loadavg_1m']:.1f}", flush=True)
    runs = result["runs"]
    labels = [label for label, _ in LAYOUT]
    result["layout"] = [{"stage": label, "part_of": parent} for label, parent in LAYOUT]
    result["median"] = {
        "process_cpu_us_per_submit": statistics.median(
            x["calibration"]["process_cpu_us_per_submit"] for x in runs),
        "stages_us_per_submit": {k: statistics.median(
            x["staged"]["stages_us_per_submit"][k] for x in runs) for k in labels},
    }
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    med = result["median"]
    print(f"median: {med['process_cpu_us_per_submit']:.0f} us of process CPU per submit")
    depth = {"": -1}
    for label, parent in LAYOUT:
        depth[label] = depth[parent] + 1
        print(f"  {'  ' * depth[label]}{label:58s} {med['stages_us_per_submit'][label]:7.1f} us")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
