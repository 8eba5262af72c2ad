"""LocalExecutor: real processes per rank, gang semantics, signals, exit codes, hangs.

Uses the contract-honouring fake trainer from conftest.py as a custom `command`
(the real trainer is exercised by the lead's e2e tests).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from computebroker.v1 import agent_pb2, common_pb2
from region_agents.executors.base import AttemptSpec
from region_agents.executors.local import LocalExecutor
from tests.agents.fake_broker import wait_for

AS = agent_pb2.AttemptState


def make_spec(command, job="j-1", attempt=1, nodes=2, gpus=8, env=None, options=None, ckpt=""):
    spec = common_pb2.JobSpec(
        name="t", command=command,
        resources=common_pb2.Resources(nodes=nodes, gpus_per_node=gpus),
        trainer=common_pb2.TrainerSpec(total_steps=20, checkpoint_every=5, model="tiny",
                                       options=options or {}),
        env=env or {},
    )
    placement = common_pb2.Placement(
        region="test-1", world_size=nodes * gpus,
        nodes=[common_pb2.NodeAssignment(node_id=f"t1-p5-{i:03d}", gpus=gpus) for i in range(nodes)],
    )
    return AttemptSpec(job_id=job, attempt=attempt, spec=spec, placement=placement,
                       checkpoint_uri=ckpt, env={"EXTRA_FROM_LAUNCH": "yes"})


class Collector:
    def __init__(self, ex: LocalExecutor):
        self.ex = ex
        self.events = []

    def pump(self):
        self.events.extend(self.ex.poll())
        return self.events

    def wait_terminal(self, timeout=90):
        def done():
            self.pump()
            return next((e for e in self.events if e.terminal), None)
        return wait_for(done, timeout, what="terminal event")

    def wait_state(self, state, timeout=60):
        return wait_for(lambda: any(e.state == state for e in self.pump()), timeout,
                        what=f"state {state}")

    def states(self):
        out = []
        for e in self.events:
            if not out or out[-1] != e.state:
                out.append(e.state)
        return out


@pytest.fixture
def ex(tmp_path):
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=2, hang_timeout_s=60,
                             starting_grace_s=1.0, progress_interval_s=0.2)
    yield executor
    executor.shutdown(0)


def test_launch_env_progress_success(ex, fake_trainer, tmp_path):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "15", "FAKE_STEP_S": "0.1"},
                        ckpt=f"file://{tmp_path}/ck"))
    assert [r.job_id for r in ex.running()] == ["j-1"]
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED and end.exit_code == 0
    assert end.progress.step == 15 and end.progress.last_checkpoint_step == 15
    states = col.states()
    assert states[0] == AS.ATTEMPT_STATE_STARTING and AS.ATTEMPT_STATE_RUNNING in states
    # Progress was reported while running (rate-limited, but more than once for 15 steps).
    running = [e for e in col.events if e.state == AS.ATTEMPT_STATE_RUNNING and e.progress]
    assert running and all(e.progress.total_steps == 15 for e in running)
    assert ex.running() == []
    # 2 nodes x min(8 GPUs, 2 ranks per node) = 4 ranks, each with torchrun-style env.
    adir = tmp_path / "work" / "jobs" / "j-1" / "attempt-1"
    outs = sorted(adir.glob("rank-*.stdout"))
    assert len(outs) == 4
    text = (adir / "rank-3.stdout").read_text()
    assert "rank 3/4 env ok: job=j-1" in text
    assert json.loads((adir / "progress.json").read_text())["state"] == "done"
    assert (tmp_path / "ck").is_dir()  # file:// URI became a local directory


def test_env_contract(ex, tmp_path):
    dump = tmp_path / "env-{rank}.json"
    script = ("import json, os; keys = [k for k in os.environ if k.startswith(('CB_', 'RANK', 'WORLD', "
              "'LOCAL_', 'MASTER_', 'EXTRA_', 'FROM_'))]; "
              f"json.dump({{k: os.environ[k] for k in keys}}, open({str(dump)!r}.format(rank=os.environ['RANK']), 'w'))")
    spec = make_spec([os.sys.executable, "-c", script], nodes=2, gpus=1, env={"FROM_SPEC": "1"})
    spec.resume_from = "s3://b/jobs/j-1/step-000000010"
    col = Collector(ex)
    ex.launch(spec)
    assert col.wait_terminal().state == AS.ATTEMPT_STATE_SUCCEEDED
    envs = [json.loads(Path(str(dump).format(rank=r)).read_text()) for r in range(2)]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}  # 2 nodes x min(1 GPU, 2)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "0"] and envs[0]["LOCAL_WORLD_SIZE"] == "1"
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1" and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    assert envs[0]["CB_JOB_ID"] == "j-1" and envs[0]["CB_ATTEMPT"] == "1"
    assert envs[0]["CB_RESUME_FROM"] == "s3://b/jobs/j-1/step-000000010"
    assert envs[0]["CB_PROGRESS_FILE"].endswith("jobs/j-1/attempt-1/progress.json")
    assert envs[0]["CB_CHECKPOINT_URI"].endswith("checkpoints/j-1")
    assert json.loads(envs[0]["CB_TRAINER_CONFIG"])["total_steps"] == 20
    assert envs[0]["EXTRA_FROM_LAUNCH"] == "yes" and envs[0]["FROM_SPEC"] == "1"
    assert envs[0]["CB_GRACE_S"] == "120"


def test_one_rank_failing_kills_the_gang(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05",
                                           "FAKE_FAIL_RANK": "2", "FAKE_FAIL_AT": "3"}))
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.exit_code == 3
    assert "rank 2 on t1-p5-001 exited with code 3" in end.message
    assert "boom: simulated crash on purpose" in end.message
    assert end.failed_nodes == ["t1-p5-001"]
    assert ex.running() == []  # the other ranks were killed, not left running


def test_stop_with_checkpoint_exits_75(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05"}))
    wait_for(lambda: any(e.progress and e.progress.step >= 2 for e in col.pump()), 60,
             what="some progress")
    ex.stop("j-1", 1, checkpoint_first=True, grace_s=60)
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED and end.exit_code == 75
    assert end.progress.last_checkpoint_step >= 2
    assert AS.ATTEMPT_STATE_CHECKPOINTING in col.states()


def test_stop_checkpoint_first_but_ignored_is_killed_after_grace(ex, fake_trainer):
    col = Collector(ex)
    # startup_timeout_s=0: the fake has the progress contract, so RUNNING is its own word
    # (every rank ignores SIGTERM by then), never assumed after the executor's start-up
    # timeout while a rank, on a loaded machine, still starts Python and would die of it
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000", "FAKE_IGNORE_TERM": "1"},
                        options={"startup_timeout_s": "0"}))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    ex.stop("j-1", 1, checkpoint_first=True, grace_s=0.5)
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_STOPPED
    assert "no checkpoint within grace" in end.message


def test_stop_without_checkpoint_is_killed(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000"}))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    ex.stop("j-1", 1, checkpoint_first=False, grace_s=0)
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_STOPPED and end.exit_code == -9
    with pytest.raises(KeyError):
        ex.stop("j-1", 1, checkpoint_first=False, grace_s=0)


def test_checkpoint_now_sends_sigusr1(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, nodes=1, env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05"}))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    ex.checkpoint("j-1", 1)
    wait_for(lambda: any(e.progress and e.progress.last_checkpoint_step > 0 for e in col.pump()),
             60, what="checkpoint after SIGUSR1")
    assert ex.running()[0].state == AS.ATTEMPT_STATE_RUNNING  # kept training


def test_hang_detection(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, nodes=1, options={"hang_timeout_s": "1.5"},
                        env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05", "FAKE_HANG_AT": "5"}))
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_FAILED
    assert end.message.startswith("hang: no progress for ")
    assert end.progress.step == 5


def _exited(pid: int) -> bool:
    """The process is a zombie (exited, not yet reaped): the executor has not seen it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_rank_killed_by_a_signal_is_blamed_over_a_peer_that_then_exited(ex, fake_trainer):
    """A lost node: its ranks die by a signal, and the peers then fail their collective
    with an exit code. When one poll finds both, the killed rank's node is the one to
    blame (the broker replaces the blamed node; blaming the peer's would keep the lost one)."""
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05",
                                           "FAKE_FAIL_RANK": "0", "FAKE_FAIL_AT": "4",
                                           "FAKE_FAIL_CODE": "1"}))
    ranks = {r.rank: r for r in ex.get("j-1", 1).ranks}  # 2 per node: ranks 2, 3 on t1-p5-001
    wait_for(lambda: _exited(ranks[0].pid), 60, what="rank 0's own exit 1")
    os.kill(ranks[2].pid, signal.SIGKILL)
    wait_for(lambda: _exited(ranks[2].pid), 30, what="rank 2 killed")
    end = Collector(ex).wait_terminal()  # the first poll sees both
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.exit_code == -signal.SIGKILL, end
    assert end.failed_nodes == ["t1-p5-001"], end
    assert "rank 2 on t1-p5-001" in end.message


def test_fail_marks_failed_nodes(ex, fake_trainer):
    col = Collector(ex)
    ex.launch(make_spec(fake_trainer, env={"FAKE_STEPS": "100000"}))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    ex.fail("j-1", 1, "node t1-p5-000 unhealthy: xid 79", ["t1-p5-000"])
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_FAILED and end.failed_nodes == ["t1-p5-000"]
    assert "xid 79" in end.message


def test_bad_command_is_a_clear_error(ex):
    with pytest.raises(ValueError, match="cannot start"):
        ex.launch(make_spec(["/nonexistent/binary"]))


@pytest.mark.parametrize("form", ["argv", "bash"])
def test_bare_python_is_the_agents_interpreter(tmp_path, form):
    """`run: python train.py` must run the agent's interpreter (the one with torch and the
    trainer library), not whatever `python` comes first on the host's PATH: here a decoy
    that exits 3. A multi-line run (bash -c) finds it through PATH, which starts with the
    interpreter's directory."""
    decoy = tmp_path / "decoy-bin"
    decoy.mkdir()
    for name in ("python", "python3"):
        (decoy / name).write_text("#!/bin/sh\necho decoy python >&2\nexit 3\n")
        (decoy / name).chmod(0o755)
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=1, starting_grace_s=1.0,
                             progress_interval_s=0.2,
                             extra_env={"PATH": f"{decoy}{os.pathsep}{os.environ['PATH']}"})
    out = tmp_path / "seen.json"
    code = (f"import json, os, sys; json.dump({{'exe': sys.executable, "
            f"'path': os.environ['PATH']}}, open({str(out)!r}, 'w'))")
    command = (["python3", "-c", code] if form == "argv"
               else ["bash", "-c", f"cd /\npython -c {shlex.quote(code)}"])
    try:
        col = Collector(executor)
        executor.launch(make_spec(command, nodes=1, gpus=1))
        end = col.wait_terminal()
        assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, end
    finally:
        executor.shutdown(0)
    seen = json.loads(out.read_text())
    assert os.path.samefile(seen["exe"], sys.executable)
    assert seen["path"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert str(decoy) in seen["path"]  # the job's own PATH entries stay, after it


def test_absolute_program_is_left_alone(ex):
    assert ex.resolve_command(["/opt/py/bin/python", "x.py"]) == ["/opt/py/bin/python", "x.py"]
    assert ex.resolve_command(["python", "x.py"]) == [ex.python, "x.py"]
    assert ex.resolve_command([]) == [ex.python, "-m", "trainer"]


SLOW_START = (
    "import json, os, sys, time\n"
    "path = os.environ['CB_PROGRESS_FILE']\n"
    "def write(state, step):\n"
    "    if os.environ['RANK'] != '0':\n"
    "        return\n"
    "    now = time.time()\n"
    "    data = {'state': state, 'step': step, 'total_steps': 3, 'time': now, 'heartbeat': now}\n"
    "    open(path + '.tmp', 'w').write(json.dumps(data))\n"
    "    os.replace(path + '.tmp', path)\n"
    "time.sleep(float(os.environ['SILENT_S']))  # 'importing torch': no progress file yet\n"
    "write('starting', 0)\n"
    "time.sleep(float(os.environ['RESUME_S']))  # resume() not finished yet\n"
    "for step in (1, 2, 3):\n"
    "    write('running', step)\n"
    "    time.sleep(0.2)\n"
    "write('done', 3)\n"
)


@pytest.fixture
def quick_ex(tmp_path):
    executor = LocalExecutor(tmp_path / "work", ranks_per_node=1, hang_timeout_s=60,
                             starting_grace_s=0.2, progress_interval_s=0.1)
    yield executor
    executor.shutdown(0)


def test_running_only_when_the_trainer_says_so(quick_ex):
    """Issue 15 defect 5 (agent half): the local executor reported RUNNING a few seconds
    after spawn without a progress file, so checkpoint-first stops reached trainers still
    importing torch. With the progress contract declared (startup_timeout_s=0), RUNNING
    comes only once the file says ``running``: neither silence nor ``starting`` is enough,
    however long they last (here longer than the executor's start-up timeout)."""
    col = Collector(quick_ex)
    quick_ex.launch(make_spec([os.sys.executable, "-c", SLOW_START], nodes=1, gpus=1,
                              env={"SILENT_S": "1.0", "RESUME_S": "0.6"},
                              options={"startup_timeout_s": "0"}))
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED
    running = [e for e in col.events if e.state == AS.ATTEMPT_STATE_RUNNING]
    assert running, "never reported RUNNING"
    first = running[0]
    # The first RUNNING report carries the trainer's own running progress (step >= 1).
    assert first.progress is not None and first.progress.step >= 1
    assert "assumed" not in first.message
    assert col.states() == [AS.ATTEMPT_STATE_STARTING, AS.ATTEMPT_STATE_RUNNING,
                            AS.ATTEMPT_STATE_SUCCEEDED]


def test_plain_script_without_progress_file_is_assumed_running(quick_ex, tmp_path):
    """A plain script never writes the progress file: after the start-up timeout it is
    reported RUNNING, marked as assumed (contracts section 2), and ends normally."""
    go = tmp_path / "go"
    script = ("import os, time\n"
              f"while not os.path.exists({str(go)!r}):\n"
              "    time.sleep(0.05)\n")
    col = Collector(quick_ex)
    quick_ex.launch(make_spec([os.sys.executable, "-c", script], nodes=1, gpus=1))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    running = [e for e in col.events if e.state == AS.ATTEMPT_STATE_RUNNING]
    assert "assumed running" in running[0].message and running[0].progress is None
    go.write_text("")
    assert col.wait_terminal().state == AS.ATTEMPT_STATE_SUCCEEDED


def test_storage_and_lease_exits_blame_no_node(ex, fake_trainer):
    """Exit 79 (a checkpoint save failed after storage retries) and 78 (the agent's lease
    ran out) are not the machine's fault: no failed_nodes, so the broker does not exclude
    the node for good. The fault campaign's S3 503 bursts used to exclude nodes until a
    job could run nowhere."""
    for job, code in (("j-store", 79), ("j-lease", 78)):
        col = Collector(ex)
        ex.launch(make_spec(fake_trainer, job=job,
                            env={"FAKE_STEPS": "100000", "FAKE_STEP_S": "0.05", "FAKE_FAIL_RANK": "0",
                                 "FAKE_FAIL_AT": "2", "FAKE_FAIL_CODE": str(code)}))
        end = col.wait_terminal()
        assert end.state == AS.ATTEMPT_STATE_FAILED and end.exit_code == code, end
        assert end.failed_nodes == [], end


def test_stop_grace_reaches_the_ranks_through_the_deadline_file(ex, tmp_path):
    """CB_GRACE_S is fixed at launch; the Stop's own grace (a 10-minute drain here) is
    written to CB_STOP_DEADLINE_FILE before the SIGTERM, and every rank reads it there."""
    dump = tmp_path / "deadline-"
    ready = tmp_path / "ready-"
    script = ("import json, os, pathlib, signal, sys, time\n"
              "got = []\n"
              "signal.signal(signal.SIGTERM, lambda *a: got.append(1))\n"
              f"pathlib.Path({str(ready)!r} + os.environ['RANK']).touch()\n"
              # RUNNING (rank 0's progress file) only once every rank can take the SIGTERM
              f"while not all(pathlib.Path({str(ready)!r} + r).exists() for r in '01'): time.sleep(0.02)\n"
              "open(os.environ['CB_PROGRESS_FILE'], 'w').write('{\"state\": \"running\"}')\n"
              "while not got: time.sleep(0.02)\n"
              "d = json.load(open(os.environ['CB_STOP_DEADLINE_FILE']))\n"
              f"json.dump(d, open({str(dump)!r} + os.environ['RANK'], 'w'))\n"
              "sys.exit(75)\n")
    col = Collector(ex)
    # RUNNING from the script's own word only (it has the progress contract): never
    # assumed after the start-up timeout while a rank still starts and would die of SIGTERM
    ex.launch(make_spec([sys.executable, "-c", script], nodes=2, gpus=1,
                        options={"startup_timeout_s": "0"}))
    col.wait_state(AS.ATTEMPT_STATE_RUNNING)
    before = time.time()
    ex.stop("j-1", 1, checkpoint_first=True, grace_s=600)
    after = time.time()
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_CHECKPOINTED and end.exit_code == 75, end.message
    for rank in (0, 1):
        d = json.loads(Path(f"{dump}{rank}").read_text())
        assert d["grace_s"] == 600
        assert before + 600 <= d["deadline"] <= after + 600  # the agent's own SIGKILL time


@pytest.mark.parametrize("spec_env, want", [
    ({}, {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}),  # torchrun's default
    ({"OMP_NUM_THREADS": "3"}, {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "1"}),  # the spec wins
])
def test_ranks_get_torchruns_thread_default_unless_the_spec_sets_it(ex, tmp_path, monkeypatch,
                                                                     spec_env, want):
    # The agent's own environment must not decide this test (a developer shell may set it).
    for var in want:
        monkeypatch.delenv(var, raising=False)
    dump = tmp_path / "threads-{rank}.json"
    script = ("import json, os; json.dump({k: os.environ.get(k) for k in "
              "('OMP_NUM_THREADS', 'MKL_NUM_THREADS')}, "
              f"open({str(dump)!r}.format(rank=os.environ['RANK']), 'w'))")
    col = Collector(ex)
    ex.launch(make_spec([sys.executable, "-c", script], nodes=1, gpus=2, env=spec_env))
    assert col.wait_terminal().state == AS.ATTEMPT_STATE_SUCCEEDED
    for rank in range(2):
        assert json.loads(Path(str(dump).format(rank=rank)).read_text()) == want


STORE_WAIT_START = (
    "import json, os, time\n"
    "path = os.environ['CB_PROGRESS_FILE']\n"
    "def write(state, step, **more):\n"
    "    now = time.time()\n"
    "    data = {'state': state, 'step': step, 'total_steps': 3, 'time': now, 'heartbeat': now,\n"
    "            'last_checkpoint_step': 0, **more}\n"
    "    open(path + '.tmp', 'w').write(json.dumps(data))\n"
    "    os.replace(path + '.tmp', path)\n"
    "since = time.time()\n"
    "for _ in range(4):  # what trainer/outage_wait.py writes while the ranks wait\n"
    "    write('store_wait', 0, store_wait_since=since,\n"
    "          store_wait_message='checkpoint store unreachable: connection refused')\n"
    "    time.sleep(0.3)\n"
    "for step in (1, 2, 3):  # the store answered: the resume ends, training runs\n"
    "    write('running', step, store_wait_since=None, store_wait_message=None)\n"
    "    time.sleep(0.3)\n"
    "write('done', 3)\n"
)


def test_ranks_waiting_for_their_store_are_reported_while_starting(quick_ex):
    """The trainer's ranks wait for their checkpoint store before they resume (progress
    state ``store_wait``): the attempt is still STARTING (a stop must not reach a
    trainer that has not resumed), but the agent reports the wait (JobUpdate.store_wait)
    so the broker can say why the job is not running yet; the first RUNNING report and
    every later one carry no wait."""
    col = Collector(quick_ex)
    quick_ex.launch(make_spec([os.sys.executable, "-c", STORE_WAIT_START], nodes=1, gpus=1,
                              options={"startup_timeout_s": "0"}))
    end = col.wait_terminal()
    assert end.state == AS.ATTEMPT_STATE_SUCCEEDED
    waiting = [e for e in col.events if e.store_wait is not None]
    assert waiting, [(e.state, e.progress) for e in col.events]
    assert all(e.state == AS.ATTEMPT_STATE_STARTING for e in waiting)
    upd = waiting[0].to_proto()
    assert upd.HasField("store_wait") and upd.store_wait.since > 0
    assert "connection refused" in upd.store_wait.message
    first_running = next(i for i, e in enumerate(col.events)
                         if e.state == AS.ATTEMPT_STATE_RUNNING)
    assert all(e.store_wait is None for e in col.events[first_running:])
    assert not end.to_proto().HasField("store_wait")
    assert col.states() == [AS.ATTEMPT_STATE_STARTING, AS.ATTEMPT_STATE_RUNNING,
                            AS.ATTEMPT_STATE_SUCCEEDED]
