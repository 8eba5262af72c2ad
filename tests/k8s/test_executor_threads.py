"""Per-rank thread defaults reach the processes in pods, as they reach the local
executor's ranks (region_agents/executors/rank_threads.py): ``OMP_NUM_THREADS=1`` and
``MKL_NUM_THREADS=1`` unless the job's env sets them, in which case the job's value
(delivered through the attempt's Secret) wins. Checked in the environment the pod's
process really got, on the real API server with the node fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from region_agents.executors.k8s_manifests import resource_name
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.helpers import (
    AS,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    terminal,
    trainer_attempt,
)

NODES = ["th-n1"]
PRINT = ("python", "-c", "import os; print('threads', os.environ.get('OMP_NUM_THREADS'), "
         "os.environ.get('MKL_NUM_THREADS'), flush=True)")


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


@pytest.mark.parametrize(("job", "env", "want"), [
    ("th-default", {}, "threads 1 1"),  # torchrun's default
    ("th-own", {"OMP_NUM_THREADS": "3"}, "threads 3 1"),  # the job's env wins
])
def test_thread_defaults_reach_the_pods_process(cluster_a: ControlPlane, kubelet: ProcessKubelet,
                                                job: str, env: dict[str, str], want: str) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt(job, NODES, ckpt, command=PRINT, env=env))
            end = state_of(poll_until(ex, terminal(job), what=f"{job} to end"), job)
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end.message
            logs = list(kubelet.root.glob(f"pods/{ns}_{resource_name(job, 1)}-0_*/trainer.cri.log"))
            assert len(logs) == 1, logs
            lines = [ln for ln in logs[0].read_text().splitlines() if "threads " in ln]
            assert lines and lines[-1].endswith(want), lines
    finally:
        ex.shutdown()
