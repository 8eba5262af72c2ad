"""Checkpoint-now that reaches a rank before the trainer library has its handler in.

Ranks start with SIGUSR1 blocked (checkpoint_layout/held_signals.py): the request stays
pending and the library delivers it right after installing its handler. Without that,
SIGUSR1's default action (terminate) killed the rank and failed the attempt: the broker
asks for a checkpoint right after a launch (a spot notice, a move).

Each rank here is a real process under the local executor. To be sure the request came
*before* the handler, the rank's command waits until SIGUSR1 is pending in it (which it
can only be if the rank started with it blocked: otherwise it would already be dead), and
only then runs the real trainer (`python -m trainer`) or, for a script without the
library, simply exits.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from checkpoint_layout.standby_go import Go, GoAction
from computebroker.v1 import common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.local import LocalExecutor
from tests.agents.fake_broker import wait_for
from tests.agents.test_local_executor import AS, Collector

# Wait (bounded) until SIGUSR1 is pending in this still-starting rank.
WAIT_FOR_HELD_USR1 = (
    "import signal, sys, time\n"
    "deadline = time.monotonic() + 120\n"
    "while signal.SIGUSR1 not in signal.sigpending():\n"
    "    if time.monotonic() > deadline:\n"
    "        sys.exit('test rank: no SIGUSR1 pending after 120 s')\n"
    "    time.sleep(0.02)\n"
)
# ... then the real trainer, exactly as `python -m trainer` starts it.
THEN_TRAIN = "import runpy\nrunpy.run_module('trainer', run_name='__main__', alter_sys=True)\n"


def trainer_spec(command: list[str], ckpt: Path, *, ranks: int, standby: bool = False,
                 job: str = "early") -> AttemptSpec:
    """One node, ``ranks`` ranks of the built-in tiny model; no periodic checkpoint (any
    save before the stop is checkpoint-now's)."""
    spec = common_pb2.JobSpec(
        name=job, command=command,
        resources=common_pb2.Resources(nodes=1, gpus_per_node=ranks),
        trainer=common_pb2.TrainerSpec(total_steps=100000, checkpoint_every=100000,
                                       global_batch_size=4, seed=7, model="tiny",
                                       step_sleep_s=0.1,
                                       options={"micro_batch_size": "2", "heartbeat_s": "0.5"}))
    placement = common_pb2.Placement(region="test-1", world_size=ranks, nodes=[
        common_pb2.NodeAssignment(node_id="t1-p5-000", gpus=ranks)])
    return AttemptSpec(job_id=job, attempt=1, spec=spec, placement=placement,
                       checkpoint_uri=f"file://{ckpt}", standby=standby)


@pytest.fixture
def ex(tmp_path):
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=2, hang_timeout_s=300,
                             starting_grace_s=1.0, progress_interval_s=0.2)
    yield executor
    executor.shutdown(0)


def _ended(col: Collector) -> bool:
    return any(e.terminal for e in col.pump())


def _checkpointed(col: Collector) -> common_pb2.Progress | None:
    """The first progress that reports a checkpoint; an end before it fails the test."""
    events = col.pump()
    end = next((e for e in events if e.terminal), None)
    assert end is None, f"the attempt ended before checkpointing: {end}"
    return next((e.progress for e in events
                 if e.progress is not None and e.progress.last_checkpoint_step > 0), None)


def _stop_and_expect_75(ex: LocalExecutor, col: Collector, job: str) -> None:
    """The attempt kept going after checkpoint-now: a checkpoint-first stop ends it 75."""
    assert [r.job_id for r in ex.running()] == [job]
    ex.stop(job, 1, checkpoint_first=True, grace_s=120)
    end = col.wait_terminal(timeout=180)
    assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED and end.exit_code == 75, end


def test_checkpoint_now_at_launch_is_held_until_the_trainer_can_take_it(ex, tmp_path) -> None:
    col = Collector(ex)
    ex.launch(trainer_spec([sys.executable, "-c", WAIT_FOR_HELD_USR1 + THEN_TRAIN],
                           tmp_path / "ck", ranks=2))
    ex.checkpoint("early", 1)  # at once: both ranks are still starting Python
    progress = wait_for(lambda: _checkpointed(col), 240, interval=0.2,
                        what="checkpoint-now's save")
    # the request was there before step 1: the save is step 1's
    assert progress.last_checkpoint_step == 1, progress
    assert (tmp_path / "ck" / "step-000000001" / "manifest.json").is_file()
    assert not any(e.terminal for e in col.events), col.events  # no rank died of it
    _stop_and_expect_75(ex, col, "early")


def test_a_standby_takes_an_early_checkpoint_now_after_its_go(ex, tmp_path) -> None:
    """Make-before-break: a standby rank starts the same way (the same launch path), parks
    before its first step holding the request, and acts on it once released."""
    col = Collector(ex)
    ex.launch(trainer_spec([sys.executable, "-c", WAIT_FOR_HELD_USR1 + THEN_TRAIN],
                           tmp_path / "ck", ranks=1, standby=True, job="early-sb"))
    ex.checkpoint("early-sb", 1)
    wait_for(lambda: _ended(col) or ex.parked("early-sb", 1), 240, interval=0.2,
             what="the standby parked")
    assert not _ended(col), col.events
    assert not list((tmp_path / "ck").glob("step-*"))  # no step before the go
    ex.go("early-sb", 1, Go(GoAction.GO, "", "test: released"))
    progress = wait_for(lambda: _checkpointed(col), 240, interval=0.2,
                        what="checkpoint-now's save after the go")
    assert progress.last_checkpoint_step == 1, progress
    _stop_and_expect_75(ex, col, "early-sb")


def test_a_script_without_the_library_ignores_checkpoint_now_and_exits_cleanly(ex,
                                                                                 tmp_path) -> None:
    """It never unblocks SIGUSR1: the request stays pending, harmless, and the rank's
    clean exit with it still pending is a success."""
    col = Collector(ex)
    spec = trainer_spec([sys.executable, "-c", WAIT_FOR_HELD_USR1 + "print('done', flush=True)\n"],
                        tmp_path / "ck", ranks=2, job="plain")
    ex.launch(spec)
    ex.checkpoint("plain", 1)
    end = col.wait_terminal(timeout=120)
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED and end.exit_code == 0, end
    adir = tmp_path / "work" / "jobs" / "plain" / "attempt-1"
    assert all((adir / f"rank-{r}.stdout").read_text() == "done\n" for r in range(2))
