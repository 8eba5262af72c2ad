"""Node-level signals: spot interruption notices and node health flips.

Why files: in the simulated cluster an operator (or a test, or the demo script)
has no EC2 metadata service to poke, so a notice is a file the agent polls:

* ``<work_dir>/spot-notices/<node_id>``: a spot interruption notice for that node.
  Content is optional: a number = seconds until reclaim (default 120, the real
  2-minute warning). Remove the file to clear it.
* ``<work_dir>/node-health/<node_id>``: content ``unhealthy[: reason]`` or
  ``healthy``; removing the file restores the inventory's health.

When a notice's deadline passes, the node turns unhealthy ("spot capacity
reclaimed"), so attempts still on it fail like on a real reclaim; removing the
notice brings it back. The same can be done in-process with :meth:`NodeSignals.inject_spot_notice` and
:meth:`NodeSignals.set_health`. On Kubernetes the executor's Node watch (conditions,
HyperPod's health label, the Node Termination Handler's spot taint) feeds
:meth:`NodeSignals.set_external`; the files and injections still work beside it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SPOT_WARNING_S = 120.0


@dataclass(frozen=True)
class HealthChange:
    node_id: str
    healthy: bool
    reason: str


class NodeSignals:
    """Tracks spot notices and health per node; reports only what changed."""

    def __init__(self, work_dir: str | os.PathLike[str], base_health: dict[str, bool]) -> None:
        self.spot_dir = Path(work_dir) / "spot-notices"
        self.health_dir = Path(work_dir) / "node-health"
        self.spot_dir.mkdir(parents=True, exist_ok=True)
        self.health_dir.mkdir(parents=True, exist_ok=True)
        self._base = dict(base_health)
        self._health: dict[str, tuple[bool, str]] = {n: (h, "") for n, h in base_health.items()}
        self._injected_spot: dict[str, float] = {}
        self._injected_health: dict[str, tuple[bool, str]] = {}
        self._external_spot: dict[str, float] = {}
        self._external_health: dict[str, tuple[bool, str]] = {}
        self._spot: dict[str, float] = {}  # node -> deadline (active notices)
        self._lock = threading.Lock()

    # ---- in-process injection ---------------------------------------------------
    def inject_spot_notice(self, node_id: str, seconds: float = SPOT_WARNING_S) -> None:
        with self._lock:
            self._injected_spot[node_id] = time.time() + seconds

    def set_health(self, node_id: str, healthy: bool, reason: str = "") -> None:
        with self._lock:
            self._injected_health[node_id] = (healthy, reason)

    def track(self, base_health: dict[str, bool]) -> None:
        """Also watch nodes that joined since the start (a cluster's inventory changes)."""
        with self._lock:
            for node, healthy in base_health.items():
                if node not in self._base:
                    self._base[node] = healthy
                    self._health[node] = (healthy, "")

    def set_external(self, spot: dict[str, float], health: dict[str, tuple[bool, str]]) -> None:
        """What the cluster itself says now (replaces the previous word): spot notices
        (node -> reclaim deadline) and health. Injections and files take precedence."""
        with self._lock:
            self._external_spot = dict(spot)
            self._external_health = dict(health)

    # ---- polling ----------------------------------------------------------------------
    def healthy(self, node_id: str) -> bool:
        with self._lock:
            return self._health.get(node_id, (True, ""))[0]

    def health_map(self) -> dict[str, tuple[bool, str]]:
        with self._lock:
            return dict(self._health)

    def active_spot_notices(self) -> dict[str, float]:
        with self._lock:
            return dict(self._spot)

    def poll(self) -> tuple[dict[str, float], list[HealthChange]]:
        """(new spot notices: node -> deadline, health changes) since the last poll."""
        file_spot = self._read_spot_files()
        file_health = self._read_health_files()
        with self._lock:
            wanted = {**self._external_spot, **file_spot, **self._injected_spot}
            new = {n: d for n, d in wanted.items() if n not in self._spot}
            self._spot = {n: self._spot.get(n, d) for n, d in wanted.items()}
            changes: list[HealthChange] = []
            now = time.time()
            for node, base in self._base.items():
                target = (self._injected_health.get(node) or file_health.get(node)
                          or self._external_health.get(node) or (base, ""))
                if node in self._spot and self._spot[node] <= now:
                    # The 2-minute warning ran out: the capacity is gone, whatever ran there.
                    target = (False, "spot capacity reclaimed")
                if self._health.get(node, (base, ""))[0] != target[0]:
                    changes.append(HealthChange(node, target[0], target[1]))
                self._health[node] = target
            return new, changes

    def _read_spot_files(self) -> dict[str, float]:
        out: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for p in self.spot_dir.iterdir():
                if p.name.startswith("."):
                    continue
                seconds = SPOT_WARNING_S
                with contextlib.suppress(OSError, ValueError):
                    text = p.read_text().strip()
                    if text:
                        seconds = float(text)
                try:
                    base = p.stat().st_mtime
                except OSError:
                    continue
                out[p.name] = base + seconds
        return out

    def _read_health_files(self) -> dict[str, tuple[bool, str]]:
        out: dict[str, tuple[bool, str]] = {}
        with contextlib.suppress(OSError):
            for p in self.health_dir.iterdir():
                if p.name.startswith("."):
                    continue
                try:
                    text = p.read_text().strip()
                except OSError:
                    continue
                word, _, reason = text.partition(":")
                healthy = word.strip().lower() in ("healthy", "ok", "true", "1")
                out[p.name] = (healthy, reason.strip() or ("" if healthy else "marked unhealthy"))
        return out
