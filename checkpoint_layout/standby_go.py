"""The make-before-break go file: the contract between a region agent and a standby trainer.

Torch-free (like the rest of checkpoint_layout) because both sides import it: the agent
writes it on the broker's Go (region_agents/executors/local.py), the trainer waits for it
(trainer/standby.py). One small JSON object, written atomically (tmp + rename) so a rank
never reads half of it: ``{"action": "go", "resume_from": "<uri>", "reason": "..."}`` or
``{"action": "abort", ...}``. Written once per attempt; writing the same go again (a Go
re-sent after a broker restart) changes nothing.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass

from checkpoint_layout.nofollow import replace_file

GO_ENV = "CB_STANDBY_GO_FILE"
GO_NAME = "go.json"  # in the attempt directory (local executor)


class GoAction(enum.Enum):
    """What the coordinator decided for a standby attempt."""

    GO = "go"  # resume from `resume_from` ("" = newest complete under the own root, or fresh)
    ABORT = "abort"  # the move was called off: exit without a step or a save


@dataclass(frozen=True)
class Go:
    action: GoAction
    resume_from: str = ""
    reason: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {"action": self.action.value, "resume_from": self.resume_from, "reason": self.reason}
        )

    @staticmethod
    def from_json(text: str) -> Go:
        raw = json.loads(text)
        return Go(GoAction(raw["action"]), str(raw.get("resume_from", "")), str(raw.get("reason", "")))


def write_go(path: str | os.PathLike[str], go: Go) -> None:
    """Atomically publish the go (tmp file + rename: a rank never reads half a file)."""
    replace_file(path, go.to_json())  # the job owns the dir: never through a link
