"""trainer/agent_lease.py: a rank stops by itself when its agent's lease runs out.

Why it matters (issue 15, cross-host fencing): a frozen agent (SIGSTOP) cannot kill its
ranks, and the broker relaunches the job elsewhere after its agent timeout; the ranks'
own watchdog is what keeps two attempts from training at once. Real processes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trainer.agent_lease import expired, lease_expired, read_deadline
from trainer.errors import EXIT_AGENT_LEASE_EXPIRED

WATCHED = ("import time, trainer.agent_lease as a; a.start_watchdog(); "
           "print('up', flush=True); time.sleep(120)")


def test_deadline_parsing(tmp_path: Path) -> None:
    f = tmp_path / "lease"
    assert read_deadline(str(f)) is None and expired(str(f)) is None  # no lease: no decision
    f.write_text("garbage\n")
    assert read_deadline(str(f)) is None
    f.write_text("1000.5\n")
    assert expired(str(f), now=1000.0) is None
    assert expired(str(f), now=1001.0) == 1000.5
    assert lease_expired({"CB_AGENT_LEASE_FILE": str(f)})  # 1000.5 is long past
    assert not lease_expired({})  # no agent lease at all


def test_a_rank_exits_once_the_lease_runs_out_and_not_before(tmp_path: Path) -> None:
    lease = tmp_path / "agent-lease"
    lease.write_text(f"{time.time() + 3600:.3f}\n")  # renewed far ahead: keeps running
    env = {"CB_AGENT_LEASE_FILE": str(lease), "RANK": "1", "PATH": "/usr/bin:/bin",
           "PYTHONPATH": ":".join(sys.path)}
    p = subprocess.Popen([sys.executable, "-c", WATCHED], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
        time.sleep(1.5)  # several watchdog polls
        assert p.poll() is None, "stopped although the lease is valid"
        lease.write_text(f"{time.time() - 1:.3f}\n")  # the agent stopped renewing it
        assert p.wait(timeout=60) == EXIT_AGENT_LEASE_EXPIRED
        assert "lease ran out" in (p.stderr.read() if p.stderr else "")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
