"""Errors the trainer reports as "retrying will not help" (exit code 2).

Why a dedicated type: the contract (docs/contracts.md) says bad configuration, a
corrupt or incompatible checkpoint and unreachable storage exit with code 2 and one
clear paragraph on stderr, never a torch traceback. Raising `TrainerError` anywhere
and catching it once in `__main__` keeps that promise in one place.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_CONFIG = 2
EXIT_CHECKPOINTED = 75


class TrainerError(Exception):
    """A user-facing failure: bad config, bad checkpoint, unreachable storage."""
