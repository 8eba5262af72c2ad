"""The one rule that says which crash a gang's failure is laid on (crash_blame.py), as
the local executor, the Kubernetes executor and the pod supervisor apply it."""

from __future__ import annotations

import signal

import pytest

from checkpoint_layout.crash_blame import BLAME_ORDER, Death, blame_key, culprit, death_of
from checkpoint_layout.pod_supervisor import pod_code


@pytest.mark.parametrize("code, death", [
    (-signal.SIGKILL, Death.KILLED),  # Popen: killed by SIGKILL
    (-signal.SIGUSR1, Death.KILLED),
    (-1, Death.KILLED),  # Kubernetes: a pod whose start failed
    (128 + signal.SIGKILL, Death.KILLED),  # 137: a pod / a shell's child, SIGKILLed
    (128 + signal.SIGTERM, Death.KILLED),  # 143
    (192, Death.KILLED),  # 128 + SIGRTMAX
    (193, Death.EXIT),
    (128, Death.EXIT),
    (1, Death.EXIT), (3, Death.EXIT), (76, Death.EXIT), (79, Death.EXIT), (82, Death.EXIT),
])
def test_the_kind_of_a_crash_from_its_code(code: int, death: Death) -> None:
    assert death_of(code) is death


def test_killed_before_exited_then_the_lowest_index() -> None:
    assert BLAME_ORDER == (Death.KILLED, Death.EXIT)
    # (who, code, index): a lost node's rank 2, and peers that failed their collective
    ranks = [("r0", 1, 0), ("r1", 1, 1), ("r2", -9, 2), ("r3", -9, 3)]
    pick = culprit(ranks, code=lambda r: r[1], order=lambda r: r[2])
    assert pick[0] == "r2"
    # the order they are listed in does not matter
    assert culprit(list(reversed(ranks)), code=lambda r: r[1], order=lambda r: r[2])[0] == "r2"
    # pods: 137 (killed) beats 1 whatever their place in the watch's list
    pods = [("pod-0", 1, 0), ("pod-1", 137, 1)]
    assert culprit(pods, code=lambda p: p[1], order=lambda p: p[2])[0] == "pod-1"
    # all exits: the lowest index
    assert culprit([("b", 3, 5), ("a", 1, 2)], code=lambda p: p[1], order=lambda p: p[2])[0] == "a"
    assert blame_key(-9, 7) < blame_key(1, 0)


def test_no_crash_is_an_error() -> None:
    with pytest.raises(ValueError):
        culprit([], code=lambda c: c, order=lambda c: c)


def test_a_pods_exit_code_follows_the_same_rule() -> None:
    # rank 0 OOM-killed (not by the supervisor), rank 1 then failed its collective
    assert pod_code([-signal.SIGKILL, 1], killed=set()) == 137
    # rank 1 crashed, the supervisor SIGKILLed rank 0: the crash is the pod's code
    assert pod_code([-signal.SIGKILL, 3], killed={0}) == 3
    # no crash: 75 if any rank checkpointed, else 0
    assert pod_code([0, 75], killed=set()) == 75
    assert pod_code([0, 0], killed=set()) == 0
