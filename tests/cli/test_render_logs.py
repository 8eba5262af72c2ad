"""brokerctl logs/events line formats: separator per attempt, rank prefix, local times."""

from __future__ import annotations

import time

from brokerctl import render_logs
from computebroker.v1 import common_pb2 as pb
from computebroker.v1 import logs_pb2 as lpb
from tests.cli.test_render import text_of


def test_attempt_separator_names_region_world_and_local_start() -> None:
    t = time.mktime((2026, 1, 2, 12, 3, 4, 0, 0, -1))
    h = lpb.LogAttemptHeader(attempt=2, region="eu-west-1", world_size=1, start_time=t)
    assert text_of(render_logs.attempt_separator(h)).strip() == (
        "── attempt 2 · eu-west-1 · world 1 · started 12:03:04 ──")
    assert text_of(render_logs.attempt_separator(lpb.LogAttemptHeader(attempt=3))).strip() == (
        "── attempt 3 ──")


def test_log_line_rank_prefix_only_when_asked() -> None:
    line = lpb.LogLine(rank=1, text="[step 3] loss 2.5")  # brackets are not markup
    assert text_of(render_logs.log_line(line, True)).strip() == "(rank 1) [step 3] loss 2.5"
    assert text_of(render_logs.log_line(line, False)).strip() == "[step 3] loss 2.5"
    assert "12 older lines dropped" in text_of(render_logs.dropped(12))


def test_event_line_is_one_readable_line() -> None:
    ev = pb.JobEvent(seq=3, time=time.time(), type="launched", from_phase=pb.JOB_PHASE_ADMITTED,
                     to_phase=pb.JOB_PHASE_LAUNCHING, region="us-east-2", attempt=1,
                     message="attempt 1 launching")
    out = text_of(render_logs.event_line(ev)).strip()
    assert out.startswith(time.strftime("%H:%M:%S", time.localtime(ev.time)) + " launched")
    assert "admitted→launching" in out and "us-east-2" in out and "#1" in out
    assert len(out.splitlines()) == 1
