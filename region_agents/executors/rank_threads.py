"""Per-rank CPU thread defaults, the same for every executor.

Why: each rank's PyTorch (OpenMP / MKL) otherwise starts one thread per core, so
several ranks on one host oversubscribe it (seen on a 2-core host: 2.6-3.0 s per step
with the default threads against 0.09-0.27 s with one). ``torchrun`` sets
``OMP_NUM_THREADS=1`` for its workers unless the variable is already set; our
executors launch ranks themselves (local agent) or run a user's own command in a pod
(Kubernetes), so they apply the same default here, in one place. A job that wants
more threads per rank sets the variable in its spec's ``env`` and that value wins.
"""

from __future__ import annotations

from collections.abc import Mapping

# The variables set for every rank, and their default (torchrun's choice for OpenMP;
# MKL follows OpenMP's count unless told otherwise, but some builds read only MKL's).
THREAD_VARS: tuple[str, ...] = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
DEFAULT_THREADS = "1"


def rank_thread_env(explicit: Mapping[str, str]) -> dict[str, str]:
    """The thread variables to add for a rank whose env already holds ``explicit``.

    A variable present in ``explicit`` (the job spec's env, the launch's env, or the
    environment the executor itself runs in) is left as it is, as torchrun does; the
    others get ``DEFAULT_THREADS``. Returns only the additions, so callers merge it
    under whatever they already have and the precedence stays visible at the call site.
    """
    return {var: DEFAULT_THREADS for var in THREAD_VARS if not explicit.get(var)}
