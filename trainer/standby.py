"""Make-before-break standby: a destination attempt that is fully started but may not step.

Why: most of a migration's downtime used to be the destination's start (interpreter,
torch import, process group, model build, FSDP wrap, optimizer state) and a
copy-then-load of the checkpoint, all of it *after* the source had finished its final
save. A standby attempt does all of that while the source still trains and saves, then
blocks in `Checkpointer.resume()` until it is told which checkpoint is durable (the
"go"); it then loads that checkpoint straight from where the source wrote it (the
source region's store) and takes its first step. docs/contracts.md section 5a
("Make-before-break").

Safety (the reason this is a separate, tiny protocol): before the go a standby has no
checkpoint to resume and no step to take, so it can never commit a checkpoint (a save
needs step >= 1) nor write progress beyond ``standby``. The go is written only after the
source attempt was fenced (it exited after its final save, or was declared lost), so two
attempts of one job can never write at once.

The go is a small JSON file (``CB_STANDBY_GO_FILE``) written atomically (tmp + rename)
by whoever coordinates the move (the region agent on the broker's Go command, or a
benchmark): ``{"action": "go", "resume_from": "<uri>"}`` or ``{"action": "abort"}``.
Every rank polls the same file (no collective while waiting: a wait of minutes must not
hit the process group's timeout).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from checkpoint_layout.standby_go import GO_ENV, Go, GoAction, write_go

__all__ = ["GO_ENV", "Go", "GoAction", "StandbyAborted", "go_file", "wait_for_go", "write_go"]
POLL_S = 0.05


class StandbyAborted(Exception):
    """The standby was told to abort (or SIGTERM'd) before its go: nothing to save."""


def go_file() -> str:
    """The go file this process waits for; "" when it is not a standby attempt."""
    return os.environ.get(GO_ENV, "")


def wait_for_go(
    path: str, terminated: Callable[[], bool], on_wait: Callable[[], None] | None = None
) -> Go:
    """Block until the go file exists; returns it. Raises StandbyAborted on an ``abort``
    go or when ``terminated()`` (SIGTERM) says the attempt is being torn down."""
    while True:
        try:
            text = Path(path).read_text()
            # empty: a Kubernetes pod's downward-API file before the Go annotation is set
            go = Go.from_json(text) if text.strip() else None
        except FileNotFoundError:
            go = None
        if go is not None:
            if go.action is GoAction.ABORT:
                raise StandbyAborted(go.reason or "move called off")
            return go
        if terminated():
            raise StandbyAborted("stopped before its go")
        if on_wait is not None:
            on_wait()
        time.sleep(POLL_S)
