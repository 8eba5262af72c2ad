"""Warm rank starters (trainer/warm_start.py, region_agents/executors/rank_zygotes.py).

One real starter process (it imports torch once) forks real children. Asserted: a
forked rank runs its program with its own argv, environment, cwd and stdio, in the
process group it was given, with SIGUSR1 held as a spawned rank has it; its exit status, a signal's included, reaches its exit
file before the agent can see it gone; a rank is held until the agent's go and never
runs if the go does not come (cancelled, or the agent died before its attempt record
held the pid: no rank the agent cannot find runs); non-Python commands are not warm.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from region_agents.executors.attempt_records import proc_start_ticks
from region_agents.executors.rank_zygotes import (
    RankZygotes,
    starter_env,
    wait_ready,
    warm_command,
)
from tests.trainer.launch import REPO

pytestmark = pytest.mark.slow
JOB, NODE = "j-warm", "n0"


@pytest.fixture(scope="module")
def starters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RankZygotes]:
    work = tmp_path_factory.mktemp("starters")
    z = RankZygotes(work, sys.executable)
    env = dict(os.environ, PYTHONPATH=str(REPO), CB_JOB_ID=JOB, CB_ATTEMPT="1", RANK="3")
    z.start(JOB, NODE, env, str(work), {})
    assert wait_ready(z, JOB, NODE, 300), (work / "rank-starters" / JOB / f"{NODE}.log").read_text()
    yield z
    z.shutdown()


def wait_file(path: Path, timeout: float = 60) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def fork(z: RankZygotes, d: Path, argv: list[str], env: dict[str, str], pgid: int = 0):
    with open(d / "out", "ab") as out, open(d / "err", "ab") as err:
        return z.fork(JOB, NODE, argv=argv, env=env, cwd=str(d), pgid=pgid,
                      exit_file=str(d / "rank.exit"), stdout_fd=out.fileno(),
                      stderr_fd=err.fileno())


def test_forked_rank_runs_its_program_and_reports_its_exit(starters: RankZygotes,
                                                          tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch
        from checkpoint_layout.held_signals import held_now
        print("argv", sys.argv[1:], "env", os.environ["FOO"], "cwd", os.getcwd(),
              "rank", os.environ.get("RANK"), "warm", "torch" in sys.modules,
              "held", sorted(s.name for s in held_now()))
        print("to stderr", file=sys.stderr)
        sys.exit(7)
    """))
    env = {"FOO": "bar", "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "RANK": "1"}
    forked = fork(starters, tmp_path, [sys.executable, str(script), "x", "--y"], env)
    assert forked is not None
    assert os.getpgid(forked.pid) == forked.pid  # pgid 0: it leads a new group at once
    forked.go()
    assert wait_file(tmp_path / "rank.exit").strip() == "7"
    out = (tmp_path / "out").read_text()
    # SIGUSR1 held, as for a spawned rank (checkpoint_layout/held_signals.py)
    assert f"argv ['x', '--y'] env bar cwd {tmp_path} rank 1 warm True held ['SIGUSR1']" in out, out
    assert "to stderr" in (tmp_path / "err").read_text()


def test_a_killed_rank_reports_the_signal(starters: RankZygotes, tmp_path: Path) -> None:
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(300)\n")
    forked = fork(starters, tmp_path, [sys.executable, str(script)], {"PATH": os.environ["PATH"]})
    assert forked is not None
    forked.go()
    time.sleep(0.3)
    os.kill(forked.pid, signal.SIGKILL)
    assert wait_file(tmp_path / "rank.exit").strip() == str(-signal.SIGKILL)


def test_a_rank_without_its_go_never_runs(starters: RankZygotes, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    forked = fork(starters, tmp_path, [sys.executable, str(script)], {"PATH": os.environ["PATH"]})
    assert forked is not None
    forked.cancel()
    assert wait_file(tmp_path / "rank.exit").strip() == "1"
    assert not marker.exists()


def test_an_agent_dying_before_the_go_leaves_nothing_running(tmp_path: Path) -> None:
    """The agent process dies between the fork and its attempt record's save: the held
    rank's go pipe closes and it exits without running a line of the program."""
    marker = tmp_path / "ran"
    script = tmp_path / "mark.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    agent = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(REPO)!r})
        from region_agents.executors.rank_zygotes import RankZygotes, wait_ready
        from pathlib import Path
        d = Path({str(tmp_path)!r})
        z = RankZygotes(d / "work", sys.executable)
        z.start("j", "n", dict(os.environ, PYTHONPATH={str(REPO)!r}), str(d), {{}})
        assert wait_ready(z, "j", "n", 300)
        with open(d / "out", "ab") as out:
            f = z.fork("j", "n", argv=[sys.executable, {str(script)!r}], env=dict(os.environ),
                       cwd=str(d), pgid=0, exit_file=str(d / "rank.exit"),
                       stdout_fd=out.fileno(), stderr_fd=out.fileno())
        print(f.pid, flush=True)
        os._exit(0)  # no go, no clean-up: as an agent killed mid-launch
    """)
    res = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr
    pid = int(res.stdout.split()[-1])
    end = time.monotonic() + 30
    while proc_start_ticks(pid) is not None and time.monotonic() < end:
        time.sleep(0.05)
    assert proc_start_ticks(pid) is None  # gone (or a zombie: it runs nothing)
    assert not marker.exists()


def test_only_python_programs_start_warm() -> None:
    py = sys.executable
    assert warm_command([py, "train.py", "--steps", "3"], py)
    assert warm_command([py, "-m", "trainer"], py)
    assert not warm_command([py, "-c", "print(1)"], py)
    assert not warm_command(["bash", "run.sh"], py)
    assert not warm_command([py], py)


def test_starter_environment_has_no_attempt_or_rank() -> None:
    env = starter_env({"PATH": "/bin", "CB_JOB_ID": "j", "CB_ATTEMPT": "2", "RANK": "1",
                       "MASTER_PORT": "1234", "CB_WORK_DIR": "/x", "OMP_NUM_THREADS": "1"}, "n7")
    assert env == {"PATH": "/bin", "CB_JOB_ID": "j", "CB_NODE_ID": "n7", "OMP_NUM_THREADS": "1"}
