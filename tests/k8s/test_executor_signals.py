"""Through the REAL API server, with the process-backed kubelet: a checkpoint-now sent
at launch reaches a trainer that is still starting in its pod without killing it (the
pod supervisor starts its ranks with SIGUSR1 blocked, and passes on a request already
set when it starts), and a gang's failure is blamed by the same rule as the local
executor's (checkpoint_layout/crash_blame.py): a pod killed by a signal before a peer
that exited with an error code, whatever order the watch lists them in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from region_agents.executors.kubernetes import KubernetesExecutor, pod_index, pod_outcome
from tests.agents.test_early_checkpoint_now import THEN_TRAIN, WAIT_FOR_HELD_USR1
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.helpers import (
    AS,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    steps_saved,
    terminal,
    trainer_attempt,
    wait,
)

NODES = ["sg-n1", "sg-n2"]


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def test_checkpoint_now_at_launch_reaches_a_trainer_still_starting(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            # the pod's command waits until SIGUSR1 is pending in it, then runs the trainer
            ex.launch(trainer_attempt("early", NODES[:1], ckpt, steps=100000, every=100000,
                                      sleep=0.2,
                                      command=("python", "-c", WAIT_FOR_HELD_USR1 + THEN_TRAIN)))
            ex.checkpoint("early", 1)  # before its pod even exists
            events = poll_until(ex, lambda evs: any(e.terminal for e in evs) or any(
                e.progress is not None and e.progress.last_checkpoint_step > 0 for e in evs),
                what="checkpoint-now's save")
            assert not any(e.terminal for e in events), state_of(events, "early")
            assert steps_saved(ckpt) == [1]  # the request was there before step 1
            assert ex.running()[0].state == AS.ATTEMPT_STATE_RUNNING  # it kept training
            ex.stop("early", 1, checkpoint_first=False, grace_s=0)
            poll_until(ex, terminal("early"), what="stopped", events=events)
    finally:
        ex.shutdown()


# Pod 0 fails at once with an exit code; pod 1 waits, then dies by SIGKILL (its node
# lost). The test lets the executor see both only together, in one pass.
PEER_THEN_KILLED = (
    "import os, pathlib, signal, sys, time\n"
    "if os.environ['NODE_RANK'] == '0':\n"
    "    sys.exit(1)\n"
    "go = pathlib.Path(os.environ['BLAME_GO'])\n"
    "while not go.exists():\n"
    "    time.sleep(0.05)\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n"
)


def _ended_codes(ex: KubernetesExecutor) -> dict[int, int]:
    """Pod index -> exit code, of the ended pods in the executor's own watch cache."""
    out = {}
    for pod in ex.pods.snapshot().values():
        code, _ = pod_outcome(pod, 0.0)
        if code is not None and pod_index(pod) is not None:
            out[pod_index(pod)] = code
    return out


def test_a_pod_killed_by_a_signal_is_blamed_over_a_peer_that_exited(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as tmp:
            go = tmp / "kill-pod-1"
            ex.launch(trainer_attempt("blame", NODES, tmp, command=("python", "-c", PEER_THEN_KILLED),
                                      env={"BLAME_GO": str(go)}))
            # no poll() meanwhile: the executor judges nothing until both have ended
            wait(lambda: _ended_codes(ex).get(0) == 1, timeout=240, what="pod 0's exit 1")
            go.touch()
            wait(lambda: _ended_codes(ex).get(1) == 137, timeout=120, what="pod 1 killed (137)")
            events = poll_until(ex, terminal("blame"), what="the gang's failure")
            end = state_of(events, "blame")
            assert end.state == AS.ATTEMPT_STATE_FAILED and end.exit_code == 137, end
            assert end.failed_nodes == [NODES[1]], end
            assert f"on node {NODES[1]} exited with code 137" in end.message, end.message
    finally:
        ex.shutdown()
