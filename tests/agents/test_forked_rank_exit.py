"""How the local executor learns a forked rank's end (region_agents/executors/local.py).

A warm-started rank is its starter's child, not the agent's: the starter writes the rank's
exit status to its exit file as it reaps it, so a rank seen gone with no status yet gets a
short wait for it. A lost node takes the rank and its starter at once: then nothing will
ever write the status, and the rank counts as ended at once (the wait only delayed the
recovery, by up to STARTER_EXIT_WAIT_S on every node loss). The starter is a real child
process, SIGKILLed.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from region_agents.executors.local import ADOPTED_EXITED, _Rank
from region_agents.executors.rank_zygotes import Forked


def gone_rank(tmp_path: Path, starter_alive) -> _Rank:
    """A forked rank whose process has ended without an exit status written (a pid
    above the kernel's largest: no such process)."""
    return _Rank(1, "n-1", None, tmp_path / "rank-1.stderr", pid=2**22 + 7, start_ticks=1,
                 forked=True, starter_alive=starter_alive)


def test_a_rank_whose_starter_lives_waits_for_the_status(tmp_path: Path) -> None:
    rank = gone_rank(tmp_path, lambda: True)
    assert rank.poll() is None  # its starter may still write it
    assert rank.gone_since > 0


def test_a_rank_lost_with_its_starter_has_ended_at_once(tmp_path: Path) -> None:
    starter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    forked = Forked(pid=0, go_fd=-1, starter=starter)
    assert forked.starter_alive()
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    assert not forked.starter_alive()
    rank = gone_rank(tmp_path, forked.starter_alive)
    assert rank.poll() == ADOPTED_EXITED  # no wait: nobody will write its status
    # a rank whose starter is unknown (re-adopted after an agent restart) keeps the wait
    assert not Forked(pid=0, go_fd=-1).starter_alive()
    assert gone_rank(tmp_path, None).poll() is None
