"""The pure parts of reading Kubernetes rank output (region_agents/executors/k8s_logs.py
and checkpoint_layout/rank_lines.py); the streams themselves run against the real API
server in tests/k8s/test_executor_logs.py."""

from __future__ import annotations

import subprocess
import sys

from checkpoint_layout import rank_lines
from region_agents.executors.k8s_logs import PodRanks, _Cursor, _rebuild, _Resume, time_ns


def test_prefixes_round_trip_and_only_the_first_is_stripped() -> None:
    line = rank_lines.prefix(3, "stderr") + b"[rank 5] not mine"
    assert rank_lines.parse(line) == (3, "stderr", b"[rank 5] not mine")
    assert rank_lines.parse(b"[rank 12] step 1") == (12, "stdout", b"step 1")
    assert rank_lines.parse(b"plain") == (None, "stdout", b"plain")
    assert rank_lines.parse(b"[rank x] no") == (None, "stdout", b"[rank x] no")


def test_a_pod_may_speak_only_for_its_own_ranks() -> None:
    pod = PodRanks(first=4, count=4)  # node rank 1 of 4-GPU pods
    assert pod.place(b"[rank 6 stderr] oops") == (6, "stderr", b"oops")
    assert pod.place(b"[rank 2] forged") == (4, "stdout", b"[rank 2] forged")
    assert pod.place(b"pod_supervisor: hello") == (4, "stdout", b"pod_supervisor: hello")


def test_kubelet_timestamps_with_trimmed_fractions_order_correctly() -> None:
    a = time_ns("2026-11-27T06:01:02.1Z")
    b = time_ns("2026-11-27T06:01:02.100000001Z")
    c = time_ns("2026-11-27T06:01:03Z")
    assert a == time_ns("2026-11-27T06:01:02.100000000Z") and a < b < c
    assert time_ns("2026-11-27T08:01:03+02:00") == c


def test_a_resume_skips_to_the_journals_last_line_not_by_time() -> None:
    """Times need not rise down a log (stdout and stderr are stamped in separate
    threads): a resumed stream takes everything after the journal's last line itself."""
    cur = _Cursor()
    for ns in (10, 12, 11, 20, 20):  # journalled; 12 was stamped before 11 was written
        cur.take(ns)
    replay = [5, 10, 12, 11, 20, 20, 19, 20, 30]  # from before the journal's start
    resume = _Resume(cur)
    assert [ns for ns in replay if resume.new(ns)] == [19, 20, 30]
    fresh = _Resume(_Cursor())
    assert [ns for ns in (3, 1, 2) if fresh.new(ns)] == [3, 1, 2]
    gone = _Resume(cur)  # the journal's end was rotated away: take from a much newer line
    late = 20 + _Resume.GIVE_UP_NS + 1
    assert [ns for ns in (21, late, late + 1) if gone.new(ns)] == [late, late + 1]
    assert gone.gave_up


def test_rank_files_are_rebuilt_from_journals_and_a_torn_line_is_cut(tmp_path) -> None:
    d = tmp_path / "a1"
    (d / "pods").mkdir(parents=True)
    (d / "pods" / "p-0.log").write_bytes(b"10 0 o step 1\n11 0 e warn\n12 0 o step 2\n13 0 o to")
    (d / "pods" / "p-1.log").write_bytes(b"10 1 o step 1\n")
    (d / "rank-0.stdout").write_bytes(b"step 1\nstep 2\nto\n")  # written past the journal
    _rebuild(d)
    assert (d / "rank-0.stdout").read_bytes() == b"step 1\nstep 2\n"
    assert (d / "rank-0.stderr").read_bytes() == b"warn\n"
    assert (d / "rank-1.stdout").read_bytes() == b"step 1\n"
    assert (d / "pods" / "p-0.log").read_bytes().endswith(b"12 0 o step 2\n")


def test_the_supervisor_prefixes_every_rank_line_and_keeps_stderr_apart() -> None:
    script = ("import sys\nprint('out')\nprint('err', file=sys.stderr)\n"
              "sys.stdout.write('tail')\n")
    env = {"PATH": "/usr/bin:/bin", "NODE_RANK": "1", "PYTHONPATH": ":".join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "checkpoint_layout.pod_supervisor", "--ranks=2",
                        "--", sys.executable, "-c", script], env=env, capture_output=True,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == b""
    lines = sorted(r.stdout.decode().splitlines())
    assert lines == sorted(f"[rank {n}{s}] {t}" for n in (2, 3)
                           for s, t in (("", "out"), (" stderr", "err"), ("", "tail")))
