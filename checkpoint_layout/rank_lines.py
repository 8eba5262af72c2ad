"""The rank prefix a trainer pod puts on each line of its output, and its parser.

Why a prefix: a pod runs one node's ranks (:mod:`checkpoint_layout.pod_supervisor`), and
the container runtime keeps one log per *container*, stdout and stderr interleaved
(``pods/log`` cannot split them without a feature gate). The supervisor therefore
copies each rank's stdout and stderr to its own stdout, every line prefixed::

    [rank 3] step 10 loss 0.53          (rank 3's stdout)
    [rank 3 stderr] Traceback (...)     (rank 3's stderr)

which reads well in ``kubectl logs`` too. The region agent strips the prefix and ships
the rest as that rank's stdout or stderr (region_agents/executors/k8s_logs.py), so
``brokerctl logs`` shows a pod's ranks exactly as it shows the local executor's.

Standard library only: it runs in the trainer's image.
"""

from __future__ import annotations

import re

STDOUT, STDERR = "stdout", "stderr"
_PREFIX = re.compile(rb"^\[rank (\d{1,7})( stderr)?\] ")


def prefix(rank: int, stream: str) -> bytes:
    """The bytes put before each line of ``rank``'s ``stream``."""
    return f"[rank {rank}{' stderr' if stream == STDERR else ''}] ".encode()


def parse(line: bytes) -> tuple[int | None, str, bytes]:
    """(rank, stream, text) of one line; (None, "stdout", line) when it has no prefix
    (the supervisor's own words, or a line a job's command wrote around it)."""
    m = _PREFIX.match(line)
    if m is None:
        return None, STDOUT, line
    return int(m.group(1)), STDERR if m.group(2) else STDOUT, line[m.end():]
