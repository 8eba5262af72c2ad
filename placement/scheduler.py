"""The placement entry point the broker calls.

Today this is first fit (the foundation issue); the placement issue replaces the
body with the topology-, cost- and quota-aware engine, keeping the signature.
"""

from __future__ import annotations

from placement.firstfit import schedule_first_fit
from placement.model import Decisions, Snapshot


def schedule(snapshot: Snapshot) -> Decisions:
    """Decide admissions, preemptions and pending reasons for one pass. Pure."""
    return schedule_first_fit(snapshot)
