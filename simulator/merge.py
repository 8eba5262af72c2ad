"""Put some policies' sections of one ``brokerctl sim`` output into another, re-render.

    python -m simulator.merge docs/sim/full /tmp/full-ours

Why: on the shared 2-core box the whole trace takes over an hour of CPU for all nine
policies; a change that can only alter some of them (e.g. ``ours`` and its variants)
re-runs those alone and replaces their sections. Refused unless both outputs come from
the same trace (sha256), seed and scenario, so a section is always what the single
command would write for it (a scenario key the older run did not know yet counts as the
same when the newer run has it at its default: the older code behaved as that default).
Sections of policies that no longer exist are dropped; each kept section's one-line
``summary`` (a description, not a measurement) is the current one. ``results.md`` and the
plots are rendered again from the merged JSON; ``timing.json`` keeps each policy's own run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from simulator import report
from simulator.policies import TABLE, PolicyKind
from simulator.run import dumps
from simulator.scenario import Scenario, _plain


class MergeError(ValueError):
    """The two outputs are not runs of the same input."""


def _defaults() -> dict:
    out = {}
    for f in dataclasses.fields(Scenario):
        if f.default is not dataclasses.MISSING:
            d = f.default
            out[f.name] = _plain(dataclasses.asdict(d) if dataclasses.is_dataclass(d) else d)
    return out


def same_scenario(old: dict, new: dict) -> bool:
    """Equal, but for keys only ``new`` has, at their defaults."""
    defaults = _defaults()
    extra = set(new) - set(old)
    if set(old) - set(new) or any(k not in defaults or new[k] != defaults[k] for k in extra):
        return False
    return all(old[k] == new[k] for k in old)


def merge(into: dict, part: dict) -> dict:
    """``into`` with ``part``'s policy sections (same trace, seed and scenario only)."""
    for key in ("trace", "seed"):
        if into.get(key) != part.get(key):
            raise MergeError(f"the two runs differ in {key}: re-run with the same inputs")
    if not same_scenario(into["scenario"], part["scenario"]):
        raise MergeError("the two runs differ in scenario: re-run with the same inputs")
    known = {k.value: k for k in PolicyKind}
    out = dict(into)
    out["scenario"] = part["scenario"]
    pols = {name: sec for name, sec in into["policies"].items() if name in known}
    pols.update(part["policies"])
    for name, sec in pols.items():
        pols[name] = {**sec, "summary": TABLE[known[name]].summary}
    out["policies"] = pols  # INTO's order, then the new policies in PART's order
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("into", help="output directory to update (result.json, timing.json)")
    ap.add_argument("part", help="output directory of the run whose policies replace those in INTO")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args(argv)
    d, p = Path(a.into), Path(a.part)
    res = merge(json.loads((d / "result.json").read_text()), json.loads((p / "result.json").read_text()))
    timing = json.loads((d / "timing.json").read_text())
    timing.update(json.loads((p / "timing.json").read_text()))
    timing = {k: v for k, v in timing.items() if k in res["policies"]}
    (d / "result.json").write_text(dumps(res))
    (d / "timing.json").write_text(json.dumps(timing, sort_keys=True, indent=1) + "\n")
    (d / "results.md").write_text(report.markdown(res, timing))
    if not a.no_plots:
        report.plots(res, d)
    print(f"{d}: {', '.join(sorted(json.loads((p / 'result.json').read_text())['policies']))} replaced")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
