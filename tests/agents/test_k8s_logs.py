"""The pure parts of reading Kubernetes rank output (region_agents/executors/k8s_logs.py
and checkpoint_layout/rank_lines.py); the streams themselves run against the real API
server in tests/k8s/test_executor_logs.py."""

from __future__ import annotations

import subprocess
import sys

from checkpoint_layout import rank_lines
from region_agents.executors.k8s_logs import PodRanks, _Cursor, _rebuild, time_ns


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


def test_the_cursor_skips_exactly_what_was_taken_counting_equal_stamps() -> None:
    cur = _Cursor()
    for ns in (1, 2, 2):
        cur.take(ns)
    # a resumed stream from before the cursor: 1, 2, 2 were taken; the third 2 is new
    stream = [1, 2, 2, 2, 3]
    seen: dict[int, int] = {}
    new = []
    for ns in stream:
        seen[ns] = seen.get(ns, 0) + 1
        if cur.after(ns, seen[ns]):
            cur.take(ns)
            new.append(ns)
    assert new == [2, 3]


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
