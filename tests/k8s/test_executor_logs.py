"""Rank output of Kubernetes attempts, on the REAL API server: the executor reads each
pod's log through ``pods/log`` (authorized by deploy/k8s/agent.yaml's Role, proxied by
the API server to the node fixture's kubelet log endpoint) into the per-rank files the
agent's log shipper tails. Checked here: lines land in their global rank's stdout or
stderr file without the supervisor's prefix, the attempt's end waits for its last
lines, and an agent restart mid-attempt neither loses nor duplicates a line (the files
keep the same bytes at the same offsets, which is what the broker dedups by)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from region_agents.executors.kubernetes import KubernetesExecutor
from region_agents.logship import LogShipper
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.agent_identity import TRAINER_SA
from tests.k8s.helpers import (
    AS,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    terminal,
    trainer_attempt,
    wait,
)

NODES = ["lg-n1", "lg-n2"]

# A job's own command runs once per pod: the prefix is the pod's node rank.
SPEAK = ("import os,sys,time\n"
         "r = os.environ['NODE_RANK']\n"
         "for i in range(int(os.environ.get('LINES', '5'))):\n"
         "    print(f'line {i} of node {r}', flush=True)\n"
         "    if i % 2 == 0: print(f'warn {i} of node {r}', file=sys.stderr, flush=True)\n"
         "    time.sleep(float(os.environ.get('GAP', '0')))\n"
         "sys.stdout.write(f'no newline at the end of {r}')\n")


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def _expected(node: int, lines: int) -> tuple[str, str]:
    out = "".join(f"line {i} of node {node}\n" for i in range(lines))
    out += f"no newline at the end of {node}\n"
    err = "".join(f"warn {i} of node {node}\n" for i in range(0, lines, 2))
    return out, err


def _shipped(sources: list, job: str, attempt: int = 1) -> dict[tuple[int, str], str]:
    """What the agent's log shipper sends of the attempt (tracked at its launch, as the
    agent does): text per (rank, stream)."""
    ship = LogShipper(interval_s=0)
    ship.track(job, attempt, sources)
    out: dict[tuple[int, str], str] = {}
    for c in ship.flush(job, attempt):
        out[(c.rank, c.stream)] = out.get((c.rank, c.stream), "") + "".join(
            line + "\n" for line in c.lines)
    return out


def test_each_pods_lines_reach_their_ranks_files_before_the_end_is_reported(cluster_a,
                                                                             kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            spec = trainer_attempt("speak", NODES, ckpt, command=("python", "-c", SPEAK),
                                   env={"LINES": "6"})
            ex.launch(spec)
            sources = ex.log_sources("speak", 1)
            assert {(s.rank, s.stream) for s in sources} == {
                (r, s) for r in (0, 1) for s in ("stdout", "stderr")}
            events = poll_until(ex, terminal("speak"), what="the gang's end")
            end = state_of(events, "speak")
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
            # at the end's report every line is in its file (the final flush ships them)
            files = {(s.rank, s.stream): s.path.read_text() for s in sources}
            for node in (0, 1):
                out, err = _expected(node, 6)
                assert files[(node, "stdout")] == out, files
                assert files[(node, "stderr")] == err, files
            assert "[rank" not in "".join(files.values())
            assert _shipped(sources, "speak") == files
    finally:
        ex.shutdown()


def test_an_agent_restart_mid_attempt_neither_loses_nor_duplicates_a_line(cluster_a,
                                                                          kubelet) -> None:
    first, ns = executor_for(cluster_a)
    ex = first
    lines = 40
    try:
        with shared_dir() as ckpt:
            spec = trainer_attempt("resume", NODES[:1], ckpt, command=("python", "-c", SPEAK),
                                   env={"LINES": str(lines), "GAP": "0.15"})
            first.launch(spec)
            (out_src,) = [s for s in first.log_sources("resume", 1) if s.stream == "stdout"]
            (err_src,) = [s for s in first.log_sources("resume", 1) if s.stream == "stderr"]
            seen: list = []
            # the agent's ticker polls the executor: that is what starts the pods' streams
            wait(lambda: seen.extend(first.poll()) or (
                out_src.path.exists() and out_src.path.read_text().count("\n") >= 8),
                 timeout=120, what="some lines read")
            first.shutdown()  # the agent dies mid-attempt (its streams end with it)
            before = out_src.path.read_bytes()
            assert b"line 39" not in before  # it died before the pod's end
            ex = KubernetesExecutor(namespace=ns, region=first.region,
                                    api_client=first.core.api_client, service_account=TRAINER_SA,
                                    grace_s=30, log_dir=str(first.pod_logs.root))
            ex.recover()
            (src,) = [s for s in ex.log_sources("resume", 1) if s.stream == "stdout"]
            assert src.path == out_src.path
            assert src.path.read_bytes().startswith(before)  # rebuilt: same bytes, same offsets
            events = poll_until(ex, terminal("resume"), what="the adopted attempt's end")
            assert state_of(events, "resume").state == AS.ATTEMPT_STATE_SUCCEEDED
            out, err = _expected(0, lines)
            assert src.path.read_text() == out  # every line once, in order
            assert err_src.path.read_text() == err
            resumed = [ps for att in ex.pod_logs._attempts.values() for ps in att.pods.values()]
            assert resumed and all(ps.opens >= 1 for ps in resumed)
    finally:
        ex.shutdown()


def test_more_pods_than_readers_take_turns_and_lose_nothing(cluster_a, kubelet) -> None:
    """One reader for a 2-pod gang (as at thousands of pods with 512 readers): the pods'
    streams take turns, each resuming after its last journalled line."""
    ex, ns = executor_for(cluster_a)
    assert ex.pod_logs is not None
    ex.pod_logs.max_streams, ex.pod_logs.slice_s = 1, 0.5
    lines = 30
    try:
        with shared_dir() as ckpt:
            spec = trainer_attempt("turns", NODES, ckpt, command=("python", "-c", SPEAK),
                                   env={"LINES": str(lines), "GAP": "0.2"})
            ex.launch(spec)
            sources = ex.log_sources("turns", 1)
            events = poll_until(ex, terminal("turns"), what="the gang's end")
            assert state_of(events, "turns").state == AS.ATTEMPT_STATE_SUCCEEDED
            files = {(s.rank, s.stream): s.path.read_text() for s in sources}
            for node in (0, 1):
                out, err = _expected(node, lines)
                assert files[(node, "stdout")] == out, files
                assert files[(node, "stderr")] == err, files
            streams = [ps for att in ex.pod_logs._attempts.values() for ps in att.pods.values()]
            assert ex.pod_logs._readers == 1
            assert sum(ps.opens for ps in streams) > 2, [ps.opens for ps in streams]  # turns
    finally:
        ex.shutdown()
