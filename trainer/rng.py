"""Every random number generator of one rank, captured into and restored from a checkpoint.

Why: a resume used to restore `torch.get_rng_state()` only, and one copy of it for all
ranks (DCP keeps one copy of a plain tensor saved under the same key by every rank).
CUDA's generators (dropout on a GPU), numpy's and Python's `random` were not saved, so
even a same-size resume of a stochastic model drew other numbers than the uninterrupted
run. Each rank now saves its own states under its own key; a resume on the same world
size restores each rank's states exactly.

After a world-size change there is no "same rank" to restore from, and no restore can
make a layer that draws over a rank's whole micro-batch independent of how samples are
split over ranks (see trainer/sample_random.py and the docs' "Randomness" page). Here:
new rank `r` restores old rank `r`'s states when the old run had one; a rank the old
run did not have is seeded from `(step, rank)`, so its streams are reproducible and
differ from every other rank's.
"""

from __future__ import annotations

import hashlib
import pickle
import random
from typing import Any

import torch

try:  # numpy is optional for the library; saved when present
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in the base venv
    np = None  # type: ignore[assignment]

# Key (under the checkpoint's "trainer" item) holding one entry per saving rank.
PER_RANK_KEY = "rng_ranks"


def capture() -> bytes:
    """This rank's generator states, pickled into one opaque value.

    One pickled blob (not a dict DCP would flatten) keeps the checkpoint's key set
    independent of what is installed (numpy, CUDA) on the saving host.
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if np is not None:
        state["numpy"] = np.random.get_state()
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def restore(blob: bytes) -> None:
    """Set this rank's generators from `capture()`'s value. A CUDA state saved on a host
    with another device count is restored for the devices both have."""
    state = pickle.loads(blob)  # noqa: S301 - the job's own checkpoint, written by capture()
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if np is not None and "numpy" in state:
        np.random.set_state(state["numpy"])
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        for device, dev_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(dev_state, device)


def seed_fresh(step: int, rank: int) -> None:
    """Seed every generator of a rank the saving run did not have, from `(step, rank)`.

    Deterministic (a rerun of the same resume draws the same numbers) and distinct per
    rank (two ranks must not share a dropout stream)."""
    digest = hashlib.sha256(f"computebroker-rng/{step}/{rank}".encode()).digest()
    seed = int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
    torch.manual_seed(seed)  # also seeds every CUDA device
    random.seed(seed)
    if np is not None:
        np.random.seed(seed & 0xFFFFFFFF)


def saved_entry(rank: int) -> dict[str, bytes]:
    """What rank `rank` adds to the checkpoint's trainer state."""
    return {str(rank): capture()}


def load_template(rank: int, saved_world: int) -> dict[str, bytes]:
    """The per-rank entry a resuming rank asks DCP for: its own old rank's, if the saving
    run had that rank, else nothing (then `seed_fresh`)."""
    return {str(rank): b""} if rank < saved_world else {}
