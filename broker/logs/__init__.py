"""Rank logs: what the ranks print, shipped by agents, stored per attempt, streamed to users.

``JobLogs`` is the one broker object for them: the agent stream hands it chunks
(``ingest``) and asks where each stream stands (``offsets_for``, for RegisterAck);
``JobService.StreamJobLogs`` iterates ``stream``. Semantics: docs/contracts.md
"Rank logs".
"""

from broker.logs.service import JobLogs

__all__ = ["JobLogs"]
