"""SIGTERM / SIGUSR1 handling that every rank agrees on.

The handlers only set flags (safe at any point, including inside a collective). Once
per step the flags are combined with `all_reduce(MAX)`, so if any rank got SIGTERM all
ranks stop after the *same* step and take the emergency checkpoint together (a rank
that decided alone would deadlock the others in the next collective). SIGUSR1 asks
for a checkpoint at the next step boundary and training continues.

Ranks start with SIGUSR1 blocked (checkpoint_layout/held_signals.py says why): it is
unblocked here, right after its handler is in, so a request that came while the rank
was starting is delivered now instead of having killed it. torch is imported only where
the flags are combined, so that `python -m trainer` installs the handlers before torch
loads.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from checkpoint_layout.held_signals import release

if TYPE_CHECKING:
    import torch


class SignalFlags:
    def __init__(self) -> None:
        self.term = False
        self.usr1 = False
        self.term_time: float | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGUSR1, self._on_usr1)
        release()  # an early checkpoint-now, held since the start, is delivered now

    def request_stop(self) -> None:
        """Stop after the current step as if SIGTERM had come, but without its grace
        deadline (the built-in trainer's simulated preemption, `stop_at_step`)."""
        self.term = True

    def _on_term(self, signum: int, frame: object) -> None:
        if not self.term:
            self.term_time = time.monotonic()
        self.term = True

    def _on_usr1(self, signum: int, frame: object) -> None:
        self.usr1 = True

    def local(self) -> tuple[int, int]:
        """This rank's (stop, checkpoint_now) flags, to combine with the other ranks'."""
        return int(self.term), int(self.usr1)

    def settle(self, stop: bool, ckpt: bool) -> tuple[bool, bool]:
        """Adopt the combined flags: clears the local SIGUSR1 flag once it was acted on,
        and starts the grace clock when the SIGTERM was a peer's."""
        if ckpt:
            self.usr1 = False
        if stop and self.term_time is None and not self.term:
            self.term_time = time.monotonic()  # learned from a peer's SIGTERM
        return stop, ckpt

    def agree(self, device: torch.device, busy: bool = False) -> tuple[bool, bool, bool]:
        """(stop, checkpoint_now, any rank's snapshot still sending) as agreed by all
        ranks (one all_reduce MAX). `busy`: this rank's memory-tier snapshot is still
        being sent; carried here so that every rank skips or takes the next snapshot
        alike (trainer/memtier.py `maybe_snapshot`) without a collective of its own."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([*self.local(), int(busy)], dtype=torch.int32, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return (*self.settle(bool(t[0].item()), bool(t[1].item())), bool(t[2].item()))


_installed: SignalFlags | None = None


def install_flags() -> SignalFlags:
    """The process's one SignalFlags, installed on first call (main thread only).

    Why a singleton: `python -m trainer` installs the handlers before importing torch
    (a SIGTERM while torch loads must be remembered), and the library's `init()`
    must then reuse those flags rather than replace the handlers and lose the signal.
    """
    global _installed
    if _installed is None:
        _installed = SignalFlags()
        _installed.install()
    return _installed
