"""What the policies are told about a job's duration: an estimate, never the trace's truth.

Why: the engine knows each trace job's true duration, but a real scheduler sees only what
the user stated (a time limit, a guess). Policies that use the duration (plan-window
fits, defragmentation's gain, better-capacity's saving) would look better than they can
be if they read the truth. The models:

- ``lognormal`` (default): true x exp(N(0, sigma)); sigma 1.0 means the estimate is within
  a factor of 2.7 of the truth two times in three (user estimates are that rough);
- ``requested_limit``: the user's requested limit: the smallest rung of a ladder of round
  limits (1 h, 2 h, 4 h, 8 h, 1 d, 3 d, 7 d, 30 d) at or above true x ``limit_padding``, as
  users pad and round up (an over-estimate by construction);
- ``exact``: the truth (an oracle, for ablations only).

Deterministic per job: each job's error is drawn from its own generator seeded by the run
seed and the job id, so it does not depend on event order or on the policy.
"""

from __future__ import annotations

import enum
import hashlib
import math
import random

LIMIT_LADDER_H = (1, 2, 4, 8, 24, 72, 168, 720)


class EstimateModel(enum.StrEnum):
    LOGNORMAL = "lognormal"
    REQUESTED_LIMIT = "requested_limit"
    EXACT = "exact"


def estimate(model: EstimateModel, true_s: float, job_id: str, seed: int, *, sigma: float = 1.0,
             padding: float = 1.5) -> float:
    """The duration a policy sees for a job whose true duration is ``true_s``."""
    if true_s <= 0 or model is EstimateModel.EXACT:
        return true_s
    if model is EstimateModel.REQUESTED_LIMIT:
        want = true_s * padding
        for h in LIMIT_LADDER_H:
            if h * 3600.0 >= want:
                return h * 3600.0
        return LIMIT_LADDER_H[-1] * 3600.0
    digest = hashlib.sha256(f"{seed}:{job_id}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return max(60.0, true_s * math.exp(rng.gauss(0.0, sigma)))


def remaining(estimate_s: float, done_s: float, floor_s: float = 600.0) -> float:
    """Remaining time as a policy would guess it: the estimate less the work done; a job
    past its estimate is assumed to have ``floor_s`` left (it has not said otherwise)."""
    return max(floor_s, estimate_s - done_s) if estimate_s > done_s else floor_s
