"""The signals a rank starts with blocked, and both ends of that contract.

Why: SIGUSR1 asks a rank for a checkpoint at its next step boundary (docs/contracts.md
section 1), but its default action is to terminate the process. A rank spends its first
seconds starting Python and importing torch before the trainer library installs its
handler, and the broker asks for a checkpoint right after a launch (a spot notice, a
move): such a request used to kill the rank and fail the attempt. So whatever starts a
rank (the local executor, the pod supervisor, the tests' launchers) starts it with
these signals *blocked* -- a signal mask is inherited over fork and kept over exec --
and the library unblocks them right after installing its handler: an early request
stays pending and is delivered then, never fatal.

Consequences, both intended: a command that never unblocks (a script without the
library) ignores checkpoint-now instead of dying of it; and a process that exits with a
signal still pending exits as it would have anyway (pending signals die with it).
SIGTERM is *not* held: it is the stop, and a rank that cannot save yet must still end
on it (a held SIGTERM would make a script without the library wait for the grace
period's SIGKILL).

Standard library only: the agent, the pod supervisor and the trainer import it.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

# Requests a rank may get before it can act on them, and that must never kill it.
HELD_AT_START: frozenset[signal.Signals] = frozenset({signal.SIGUSR1})


@contextlib.contextmanager
def held_for_children() -> Iterator[None]:
    """Block ``HELD_AT_START`` in the calling thread for the body (the Popen of a rank),
    then restore the thread's own mask.

    Why the thread's mask (``pthread_sigmask``), not ``preexec_fn``: the mask is
    per thread, so the agent's other threads keep receiving signals meanwhile, and
    ``preexec_fn`` is unsafe in a threaded process (and disables vfork). Python's
    subprocess gives the child the mask of the thread that called Popen."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_START)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def release() -> None:
    """The rank's end: unblock ``HELD_AT_START`` in the calling thread (the main thread,
    right after its handlers are installed). A request that came early is delivered
    here, to those handlers. Harmless where nothing was blocked (torchrun, a laptop)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_AT_START)


def held_now() -> frozenset[signal.Signals]:
    """The held signals still blocked in the calling thread (for checks and tests)."""
    return frozenset(HELD_AT_START & signal.pthread_sigmask(signal.SIG_BLOCK, []))
