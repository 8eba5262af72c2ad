"""A broker on a ``redis+sentinel://`` store through a SIGKILL of the Redis primary.

Real redis-server primary + 2 replicas + 3 redis-sentinels, a real broker (gRPC over TLS)
and a scripted region agent (tests/broker/harness.py): clients submit in a burst, the
agent reports running jobs SUCCEEDED before and across the kill. After the failover every
submit the clients got an answer for and every terminal update the broker acknowledged
(JobUpdateAck) is in the store, and a job submitted after the kill is launched (the
scheduler resumed). How long that took is measured by benchmarks/store_failover.py
(``--broker-reps``), not asserted here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import store_failover  # noqa: E402

pytestmark = pytest.mark.slow


def test_broker_keeps_every_acknowledged_write_and_schedules_after_primary_sigkill(
        tmp_path: Path) -> None:
    o = store_failover.run_broker_once(tmp_path)
    assert o.acked_submits > 0 and o.acked_terminal > 0, o
    assert (o.submits_lost, o.terminal_lost) == (0, 0), o
    assert o.schedule_resume_s > 0, o
