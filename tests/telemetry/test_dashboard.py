"""The Grafana dashboard queries only metrics the broker exports (no stale names)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from broker.telemetry import METRIC_NAMES

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "compute-broker.json"


def test_dashboard_uses_exported_metric_names() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][0]["query"])
    used = {re.sub(r"_(bucket|count|sum)$", "", m)
            for e in exprs for m in re.findall(r"computebroker_[a-z_]+", e)}
    exported = set(METRIC_NAMES.values())
    assert used, "no metric in the dashboard"
    assert used <= exported, f"not exported by the broker: {sorted(used - exported)}"
    # every exported metric has a panel
    assert exported <= used, f"no panel for: {sorted(exported - used)}"
