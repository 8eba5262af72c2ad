"""One trace per job across real processes: SDK -> broker -> agent -> trainer.

Every process writes its spans to one ``CB_TRACE_FILE`` (JSON lines). The SDK runs in
its own process (a tracer provider is process-wide, and this pytest process must stay
untraced for the other tests); broker and agent are `brokerctl` processes, and the agent
starts the trainer ranks with the broker's ``TRACEPARENT`` in their environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import ROOT, Cluster, free_port, wait_until

SDK_SCRIPT = textwrap.dedent("""
    import sys
    from brokersdk.client import BrokerClient
    from broker.telemetry import flush_tracing, setup_tracing
    from computebroker.v1 import common_pb2 as pb

    assert setup_tracing("sdk-test"), "CB_TRACE_FILE should turn tracing on"
    spec = pb.JobSpec(
        name="traced", team="ml", priority_class="training",
        resources=pb.Resources(nodes=1, gpus_per_node=1),
        trainer=pb.TrainerSpec(total_steps=4, checkpoint_every=2, global_batch_size=4,
                               seed=3, model="tiny"))
    with BrokerClient(sys.argv[1]) as client:
        print(client.submit(spec).id)
    flush_tracing()
""")
pytestmark = pytest.mark.slow  # starts trainer processes


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def one(spans: list[dict[str, Any]], name: str, **attrs: Any) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, f"{len(found)} {name} spans with {attrs}: {found}"
    return found[0]


def test_job_trace_spans_sdk_broker_and_trainer(cluster: Cluster, tmp_path: Path) -> None:
    trace_file = tmp_path / "spans.jsonl"
    cluster.extra_env["CB_TRACE_FILE"] = str(trace_file)
    cluster.start_broker()
    cluster.start_agent("us-east-2", nodes=1, gpus=1)
    with cluster.client() as client:
        client.set_team_quota(team="ml", guaranteed_gpus=8)
        wait_until(lambda: any(r.connected for r in client.regions()), timeout=60,
                   what=f"agent connected\n{cluster.logs()}")
        env = {**cluster.env(), "CB_TRACE_FILE": str(trace_file)}
        out = subprocess.run([sys.executable, "-c", SDK_SCRIPT, cluster.address], env=env,
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
        assert out.returncode == 0, out.stderr
        job_id = out.stdout.strip().splitlines()[-1]
        job = client.job(job_id).wait(timeout=120)
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, f"{job}\n{cluster.logs()}"

    spans = wait_until(lambda: (s := read_spans(trace_file))
                       and any(x["name"] == "train_attempt" for x in s) and s,
                       timeout=30, what="trainer spans in the trace file")
    submit = one(spans, "submit_job")
    trace_id = submit["trace_id"]
    assert submit["service"] == "sdk-test" and submit["attributes"]["cb.job.id"] == job_id
    job_span = one(spans, "job", **{"cb.job.id": job_id})
    assert job_span["service"] == "compute-broker"
    assert (job_span["trace_id"], job_span["parent_id"]) == (trace_id, submit["span_id"])
    # The traceparent stored on the job is the broker's job span.
    assert job.trace_parent.split("-")[1:3] == [trace_id, job_span["span_id"]]

    launch = one(spans, "launch", **{"cb.job.id": job_id})
    assert (launch["trace_id"], launch["parent_id"]) == (trace_id, job_span["span_id"])
    assert launch["attributes"]["cb.attempt"] == 1 and launch["attributes"]["cb.region"] == "us-east-2"
    passes = {s["span_id"]: s for s in spans if s["name"] == "schedule_pass"}
    assert [lk["span_id"] for lk in launch["links"]] and launch["links"][0]["span_id"] in passes
    admitting = passes[launch["links"][0]["span_id"]]
    assert admitting["attributes"]["cb.admitted"] == 1
    assert admitting["attributes"]["cb.pending"] >= 1

    attempt = one(spans, "train_attempt")
    assert attempt["service"] == "trainer"
    assert (attempt["trace_id"], attempt["parent_id"]) == (trace_id, launch["span_id"])
    assert attempt["attributes"]["cb.exit_code"] == 0
    assert attempt["attributes"]["cb.job.id"] == job_id
    saves = [s for s in spans if s["name"] == "checkpoint_save"]
    assert sorted(s["attributes"]["step"] for s in saves) == [2, 4]
    for s in saves:
        assert (s["trace_id"], s["parent_id"]) == (trace_id, attempt["span_id"])
        assert s["attributes"]["bytes"] > 0
        assert attempt["start"] <= s["start"] <= s["end"] <= attempt["end"]


def run_trainer(tmp_path: Path, extra: dict[str, str], **options: Any) -> subprocess.CompletedProcess:
    cfg = {"total_steps": 4, "checkpoint_every": 2, "global_batch_size": 4, "seed": 1,
           "model": "tiny", "options": options}
    env = {k: v for k, v in os.environ.items() if k not in ("CB_TRACE_FILE", "TRACEPARENT")}
    env.update({
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1",
        "CB_JOB_ID": "j-trace", "CB_ATTEMPT": "1", "CB_CHECKPOINT_URI": str(tmp_path / "ckpt"),
        "CB_TRAINER_CONFIG": json.dumps(cfg), "CB_PROGRESS_FILE": str(tmp_path / "progress.json"),
        "PYTHONPATH": str(ROOT),
    })
    env.update(extra)
    return subprocess.run([sys.executable, "-m", "trainer"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_trainer_spans_follow_traceparent_and_cost_nothing_without_exporter(tmp_path: Path) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    tp = f"00-{trace_id}-b7ad6b7169203331-01"
    trace_file = tmp_path / "spans.jsonl"
    # TRACEPARENT but no exporter: no spans anywhere (stops after step 2 with a checkpoint).
    first = run_trainer(tmp_path, {"TRACEPARENT": tp}, stop_at_step=2)
    assert first.returncode == 75, first.stderr
    assert not trace_file.exists()
    # Resume with an exporter: load + save + attempt, all in the given trace.
    second = run_trainer(tmp_path, {"TRACEPARENT": tp, "CB_TRACE_FILE": str(trace_file)})
    assert second.returncode == 0, second.stderr
    spans = read_spans(trace_file)
    assert {s["trace_id"] for s in spans} == {trace_id}
    attempt = one(spans, "train_attempt")
    assert attempt["parent_id"] == "b7ad6b7169203331"
    load = one(spans, "checkpoint_load")
    assert load["parent_id"] == attempt["span_id"]
    assert load["attributes"]["step"] == 2 and load["attributes"]["bytes"] > 0
    save = one(spans, "checkpoint_save")
    assert save["parent_id"] == attempt["span_id"] and save["attributes"]["step"] == 4
