"""Read a job trace CSV (the columns of the development trace, ``../shared/traces/philly_dev.csv``).

That trace sits next to the repository (``../shared/traces/`` from its root), not in it:
51,659 jobs, the first 54 days of Microsoft's Philly GPU-cluster trace (Jeon et al.,
USENIX ATC 2019, CC-BY-4.0) as pre-processed for the Pollux and Sia simulators, converted
to the columns below. Any CSV with the same columns works.

Only ``job_id, submit_time_s, duration_s, num_gpus, user_or_team`` are used;
``gpu_type`` and ``status`` may be empty. Rows with bad numbers are refused with their
line number (a silently dropped job would bias every metric).
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

REQUIRED = ("job_id", "submit_time_s", "duration_s", "num_gpus", "user_or_team")


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    submit_s: float
    duration_s: float
    gpus: int
    team: str


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """The first ``limit`` jobs (by file order), sorted by submit time then id."""
    out: list[TraceJob] = []
    try:
        f = open(path, newline="")  # noqa: SIM115 - closed below
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e}") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceError(f"trace {path} lacks column(s) {', '.join(missing)};"
                             f" expected {','.join(REQUIRED)},gpu_type,status")
        for line, row in enumerate(reader, start=2):
            if limit is not None and len(out) >= limit:
                break
            try:
                job = TraceJob(row["job_id"], float(row["submit_time_s"]), float(row["duration_s"]),
                               int(row["num_gpus"]), row["user_or_team"])
            except (TypeError, ValueError) as e:
                raise TraceError(f"trace {path} line {line}: {e}") from None
            if job.gpus <= 0 or job.duration_s < 0 or job.submit_s < 0:
                raise TraceError(f"trace {path} line {line}: num_gpus must be > 0 and times >= 0")
            out.append(job)
    out.sort(key=lambda j: (j.submit_s, j.id))
    return out
