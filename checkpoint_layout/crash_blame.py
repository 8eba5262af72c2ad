"""Which of several crashed ranks (or pods) a gang's failure is laid on: one rule for the
local executor, the Kubernetes executor and the pod supervisor.

Why a rule: when a node is lost, its ranks die by a signal (SIGKILL as the node goes, the
OOM killer) and their peers then fail their next collective with an ordinary exit code.
One look (an executor's poll, the supervisor's tick) often finds both. The one to blame
is the rank that was killed: the broker replaces the blamed node, and blaming a peer's
would replace a healthy node and relaunch on the lost one. Among crashes of the same
kind, the lowest rank (or pod index) goes first, so the choice does not depend on the
order in which a watch or a dict happened to list them.

Standard library only: the pod supervisor, which runs in the trainer's image, uses it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

# 128 + N: how a shell, a container runtime (and so a pod's exit code) and our pod
# supervisor report "killed by signal N"; Popen's returncode says -N.
SIGNAL_EXIT_BASE = 128
SIGNAL_MAX = 64  # SIGRTMAX on Linux


class Death(enum.Enum):
    """How a rank or pod ended, as far as blame is concerned."""

    KILLED = "killed from outside (a signal; a pod: also a start that failed)"
    EXIT = "exited with an error code of its own"


# The decision, as data: crashes are blamed in this order of kinds (the first found is
# the culprit); within a kind, by rank or pod index.
BLAME_ORDER: tuple[Death, ...] = (Death.KILLED, Death.EXIT)


def death_of(code: int) -> Death:
    """The kind of a crash's exit code: ``-N`` (Popen) and ``128+N`` (shell, container,
    pod supervisor) are deaths by signal N, and so is the Kubernetes executor's ``-1``
    for a pod whose start failed (not the trainer's doing either); anything else is the
    process's own exit."""
    if code < 0 or SIGNAL_EXIT_BASE < code <= SIGNAL_EXIT_BASE + SIGNAL_MAX:
        return Death.KILLED
    return Death.EXIT


def blame_key(code: int, order: int) -> tuple[int, int]:
    """Sort key of one crash: smaller = blamed first (``BLAME_ORDER``, then ``order``)."""
    return BLAME_ORDER.index(death_of(code)), order


def culprit(crashes: Iterable[T], code: Callable[[T], int], order: Callable[[T], int]) -> T:
    """The crash to blame among ``crashes`` (not empty), whatever they are (ranks, pods):
    ``code`` gives each one's exit code, ``order`` its rank or pod index."""
    return min(crashes, key=lambda c: blame_key(code(c), order(c)))
