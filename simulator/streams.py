"""Random streams of the simulated fleet: one generator per (random process, node).

Why not one generator for the run: with one generator the n-th draw of a node's failure
process depends on how many spot interruptions and hangs were drawn before it, so a
change to one rate (or to the order events happen in) reshuffles every other process,
and two runs that should differ in one thing differed in all of them (the failure
study's "no failures" row had a *lower* goodput than a row with failures).

Each stream is keyed by names, not by position: the run seed, the scenario's name, the
process ("node_fail", "hang", "spot") and the node id go through numpy's
``SeedSequence`` (the hash of the names as its spawn key), so the same
(scenario, seed) gives every node the same failure, hang and spot times whichever
policy runs, in whichever process, in whichever order, next to whichever other runs.

The policy is deliberately *not* part of the key: every policy meets the same weather
(common random numbers), so a difference between two rows is the policies' and not the
dice's. A row is still a function of its (policy, scenario, seed) alone.
"""

from __future__ import annotations

import enum
import hashlib
import math
import random

import numpy as np


class Process(enum.StrEnum):
    NODE_FAIL = "node_fail"
    HANG = "hang"
    SPOT = "spot"


def _key(*names: str) -> tuple[int, ...]:
    digest = hashlib.sha256("\x00".join(names).encode()).digest()
    return tuple(int.from_bytes(digest[i:i + 4], "big") for i in range(0, 16, 4))


class Streams:
    """The run's generators, made on first use (see module doc)."""

    def __init__(self, seed: int, scenario: str) -> None:
        self.seed, self.scenario = seed, scenario
        self._gens: dict[tuple[Process, str], random.Random] = {}

    def gen(self, process: Process, node: str) -> random.Random:
        g = self._gens.get((process, node))
        if g is None:
            ss = np.random.SeedSequence(entropy=self.seed, spawn_key=_key(self.scenario, process.value, node))
            g = self._gens[(process, node)] = random.Random(int(ss.generate_state(2, np.uint64)[0]))
        return g

    def exp_s(self, process: Process, node: str, rate_per_h: float) -> float:
        """Seconds to the next event of a Poisson process of ``rate_per_h`` (inf at 0)."""
        if rate_per_h <= 0:
            return math.inf
        return self.gen(process, node).expovariate(rate_per_h / 3600.0)
