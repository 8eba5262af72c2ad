"""Progress, hang detection, checkpoint-now and make-before-break standbys of trainer
pods, through the REAL API server: the pod's supervisor publishes the trainer's progress
file as an annotation of its own pod (the agent's pod watch reads it); the agent's
annotations reach the pod through the downward API (checkpoint-now, the standby's Go)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpoint_layout.standby_go import Go, GoAction
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

NODES = ["pg-n1", "pg-n2"]


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def _step(evs, at_least: int) -> bool:
    return any(e.progress is not None and e.progress.step >= at_least for e in evs)


def test_progress_leaves_the_pod_and_checkpoint_now_reaches_the_trainer(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("prog", NODES, ckpt, steps=100000, every=100000, sleep=0.3))
            events = poll_until(ex, lambda evs: _step(evs, 3), what="progress from the pod")
            running = [e for e in events if e.state == AS.ATTEMPT_STATE_RUNNING]
            assert running, "RUNNING once the trainer said so"
            steps = [e.progress.step for e in events if e.progress is not None]
            assert steps == sorted(steps)
            info = ex.running()[0]
            assert info.progress is not None and info.progress.step >= 3
            assert not steps_saved(ckpt)  # no periodic checkpoint in this run
            ex.checkpoint("prog", 1)
            saved = wait(lambda: steps_saved(ckpt), timeout=120, what="checkpoint-now's save")
            events = poll_until(ex, lambda evs: any(
                e.progress is not None and e.progress.last_checkpoint_step >= saved[0]
                for e in evs), what="the checkpoint in the progress", events=events)
            ex.stop("prog", 1, checkpoint_first=False, grace_s=0)
            poll_until(ex, terminal("prog"), what="stopped", events=events)
    finally:
        ex.shutdown()


def test_a_silent_trainer_is_failed_as_hung(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            once = ("import json,os,time\n"
                    "p=os.environ['CB_PROGRESS_FILE']; t=time.time()\n"
                    "open(p,'w').write(json.dumps({'state':'running','step':1,'time':t,"
                    "'heartbeat':t}))\n"
                    "time.sleep(600)\n")
            spec = trainer_attempt("hang", NODES[:1], ckpt, command=("python", "-c", once))
            spec.spec.trainer.options["hang_timeout_s"] = "10"
            ex.launch(spec)
            events = poll_until(ex, terminal("hang"), what="the hang to be detected")
            end = state_of(events, "hang")
            assert end.state == AS.ATTEMPT_STATE_FAILED
            assert end.message.startswith("hang: no progress for"), end.message
            assert any(e.progress is not None and e.progress.step == 1 for e in events)
    finally:
        ex.shutdown()


def test_a_standby_parks_in_its_pod_until_the_go(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("standby", NODES, ckpt, steps=6, every=3, standby=True))
            wait(lambda: (ex.poll(), ex.parked("standby", 1))[1], timeout=240, what="parked")
            assert not steps_saved(ckpt)
            assert ex.running()[0].state == AS.ATTEMPT_STATE_STARTING  # parked is not running
            ex.go("standby", 1, Go(GoAction.GO, "", "test"))
            events = poll_until(ex, terminal("standby"), what="the released standby to finish")
            end = state_of(events, "standby")
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
            assert steps_saved(ckpt)[-1] == 6
    finally:
        ex.shutdown()
