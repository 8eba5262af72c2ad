"""``brokerctl agent --executor kubernetes`` as a real process against the REAL API
server, authenticated by KUBECONFIG with deploy/k8s/agent.yaml's identity, talking to a
scripted broker (tests/agents/fake_broker.py: a real mutual-TLS gRPC server). It
registers the cluster's GPU nodes, runs a real trainer in pods, is SIGKILLed mid-attempt,
and its successor process re-adopts the attempt, passes on a spot-interruption taint as
a SpotNotice, and stops the attempt checkpoint-first: CHECKPOINTED, exit 75. The ranks'
lines reach the broker from both processes (read through ``pods/log``), and what the
successor resends sits at the same byte offsets with the same text: after the broker's
dedup by offset, every line once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2
from region_agents.executors.k8s_nodes import SPOT_TAINT
from region_agents.fencing import DEFAULT_AGENT_TIMEOUT_S, SELF_FENCE_FRACTION
from tests.agents.fake_broker import FakeBroker, wait_for
from tests.fixtures.k8s.controlplane import REPO, ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.fixtures.pki import session_pki
from tests.k8s.agent_identity import TRAINER_SA, agent_kubeconfig
from tests.k8s.conftest import make_namespace
from tests.k8s.helpers import process_nodes, shared_dir, steps_saved, trainer_attempt
from tests.k8s.helpers import wait as wait_until

AS = agent_pb2.AttemptState
NODES = ["ap-n1", "ap-n2"]
REGION, AGENT_ID = "us-east-2", "k8s-agent"
SELF_FENCE_S = SELF_FENCE_FRACTION * DEFAULT_AGENT_TIMEOUT_S  # a successor's, before any ack


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def _agent(broker: FakeBroker, ns: str, kubeconfig: Path, work: Path, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "brokerctl", "agent", "--executor", "kubernetes",
            "--namespace", ns, "--service-account", TRAINER_SA, "--region", REGION,
            "--agent-id", AGENT_ID, "--broker", broker.address, "--work-dir", str(work),
            *session_pki().agent_flags(REGION, AGENT_ID)]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def test_a_kubernetes_agent_process_survives_sigkill_and_stops_truthfully(cluster_a, kubelet,
                                                                          tmp_path) -> None:
    ns = make_namespace(cluster_a)
    kubeconfig = agent_kubeconfig(cluster_a, ns)
    broker = FakeBroker(heartbeat_interval_s=0.5)
    broker.start()
    log = tmp_path / "agent.log"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_agent(broker, ns, kubeconfig, tmp_path / "work", log))
        reg = wait_for(lambda: broker.of("register"), 120, what="register")[0]
        assert reg.executor == "kubernetes" and reg.region == REGION
        nodes = {n.id: n for n in reg.nodes}
        assert set(NODES) <= set(nodes) and nodes[NODES[0]].gpus == 1
        with shared_dir() as ckpt:
            spec = trainer_attempt("proc", NODES, ckpt, steps=100000, every=5, sleep=0.2)
            launch = agent_pb2.Launch(job_id="proc", attempt=1, spec=spec.spec,
                                      placement=spec.placement, checkpoint_uri=str(ckpt))
            assert broker.wait_ack(broker.send(launch=launch)).accepted
            wait_for(lambda: any(u.state == AS.ATTEMPT_STATE_RUNNING and u.progress.step > 0
                                 for u in broker.updates("proc", 1)), 240,
                     what="RUNNING with progress", interval=0.2)
            wait_until(lambda: steps_saved(ckpt), timeout=120, what="a checkpoint")
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(30)
            killed = time.monotonic()
            procs.append(_agent(broker, ns, kubeconfig, tmp_path / "work", log))
            reg2 = wait_for(lambda: broker.of("register", conn=2), 120, what="re-register")[0]
            gap = time.monotonic() - killed
            assert [(r.job_id, r.attempt) for r in reg2.running] == [("proc", 1)], log.read_text()
            if gap > SELF_FENCE_S - 3:
                # The successor took about as long to start as the broker waits before it
                # declares an agent lost (a loaded machine): by design it must then kill
                # what it adopted (the broker may relaunch it elsewhere), not let it run.
                limit = time.monotonic() + 5  # its ticker logs it right after starting
                while "self-fence" not in log.read_text() and time.monotonic() < limit:
                    time.sleep(0.2)
                if "self-fence" in log.read_text():
                    end = broker.wait_terminal("proc", 1, timeout=180)
                    assert end.state == AS.ATTEMPT_STATE_STOPPED, end.message
                    pytest.skip(f"the successor needed {gap:.0f} s to start (machine load), more"
                                " than the self-fence deadline: it killed the adopted attempt,"
                                " as it must; the checkpoint-first stop was not reached")
            # the Node Termination Handler's taint becomes a SpotNotice in a heartbeat
            cluster_a.core().patch_node(NODES[1], {"spec": {"taints": [
                {"key": SPOT_TAINT, "value": "evt", "effect": "NoSchedule"}]}})
            wait_for(lambda: [s for h in broker.of("heartbeat", conn=2) for s in h.spot_notices
                              if s.node_id == NODES[1]], 60, what="spot notice", interval=0.2)
            stop = agent_pb2.Stop(job_id="proc", attempt=1, checkpoint_first=True, grace_s=60,
                                  reason=agent_pb2.STOP_REASON_MIGRATE)
            assert broker.wait_ack(broker.send(stop=stop)).accepted
            end = broker.wait_terminal("proc", 1, timeout=180)
            assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED, (end.message, log.read_text()[-3000:])
            assert end.exit_code == 75
            assert end.progress.last_checkpoint_step > 0
            assert_log_chunks_resume_exactly(broker)
    finally:
        cluster_a.core().patch_node(NODES[1], {"spec": {"taints": []}})
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        broker.stop()


def assert_log_chunks_resume_exactly(broker: FakeBroker) -> None:
    """The LogChunks of ("proc", 1) from both agent processes, merged as the broker does
    (by byte offset per rank and stream): no offset with two texts, no gap, and the
    successor shipped lines its predecessor never read."""
    lines: dict[tuple[int, str], dict[int, tuple[str, int]]] = {}
    newest: dict[int, int] = {}  # connection -> highest line offset it shipped
    for conn, msg in list(broker.messages):
        if msg.WhichOneof("msg") != "log_chunk":
            continue
        c = msg.log_chunk
        if (c.job_id, c.attempt) != ("proc", 1):
            continue
        off = c.offset
        for text, size in zip(c.lines, c.sizes, strict=True):
            seen = lines.setdefault((c.rank, c.stream), {}).setdefault(off, (text, size))
            assert seen == (text, size), f"offset {off} of rank {c.rank} {c.stream}: {seen} vs {text!r}"
            newest[conn] = max(newest.get(conn, -1), off)
            off += size
    assert (0, "stdout") in lines, lines.keys()
    for key, by_off in lines.items():
        pos = 0
        for off in sorted(by_off):
            assert off == pos, f"{key}: a gap before offset {off} (expected {pos})"
            pos += by_off[off][1]
    assert newest.get(2, -1) > newest.get(1, -1), newest  # lines read after the restart
    assert not any("[rank " in t for by_off in lines.values() for t, _ in by_off.values())
