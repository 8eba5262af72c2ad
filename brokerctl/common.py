"""What every brokerctl command shares: exit codes, the usage error, flag parsing helpers."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.console import Console

from broker.api.limits import MAX_SPEC_FILE_BYTES
from brokerctl import render

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT = 0, 1, 2


class UsageError(Exception):
    """Bad command-line input (argparse or our own checks): exit 2."""


PIPE_WIDTH = 1000  # "wide": rows as long as their values, for grep/awk and logs


def consoles() -> tuple[Console, Console]:
    """stdout and stderr consoles, made per invocation so that captured output (tests) is
    honoured. On a terminal, tables fit its width (values cut with an ellipsis, the whole
    text is in ``job ID`` / ``-o json``). When stdout is not a terminal (a pipe, a file, a
    CI log) nothing is ever cut: with ``COLUMNS`` set, cells wrap at that width; without,
    each row is one line as wide as its values (wide mode)."""
    out = Console(highlight=False)
    if not out.is_terminal:
        render.set_full_values(True)
        if not os.environ.get("COLUMNS"):  # no width asked for: one whole row per line
            out = Console(highlight=False, width=PIPE_WIDTH)
    else:
        render.set_full_values(False)
    return out, Console(stderr=True, highlight=False)


def csv_values(values: Sequence[str] | None) -> list[str]:
    """Flags given several times and/or comma separated: --region a,b --region c."""
    out: list[str] = []
    for v in values or []:
        out += [p.strip() for p in v.split(",") if p.strip()]
    return out


def kv_pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values or []:
        if "=" not in v:
            raise UsageError(f"{flag} expects KEY=VALUE, got {v!r}")
        k, _, val = v.partition("=")
        out[k.strip()] = val
    return out


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.I)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> float:
    """Seconds from a duration: ``24h``, ``90m``, ``1d2h``, ``1h30m``, ``45s``, ``2w`` or a
    bare number of seconds. Why our own parser: people type what ``kubectl``/``sleep``
    accept, and one clear error beats a ``bad time`` about a field they did not set."""
    v = value.strip().lstrip("+").replace(" ", "")
    try:
        seconds = float(v)
    except ValueError:
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(v):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _UNIT_S[m.group(2).lower()]
            pos = m.end()
        if pos != len(v) or not v:
            raise UsageError(
                f"bad duration {value!r}: use e.g. 24h, 90m, 1d2h, 45s or seconds") from None
    if seconds <= 0:
        raise UsageError(f"bad duration {value!r}: must be more than 0")
    return seconds


def parse_time(value: str, now: float | None = None) -> float:
    """Epoch seconds from "now", a relative "+2h"/"+1d2h"/"+90m", an epoch number or ISO 8601."""
    now = time.time() if now is None else now
    v = value.strip()
    if v == "now":
        return now
    if v.startswith("+"):
        try:
            return now + parse_duration(v)
        except UsageError:
            raise UsageError(f"bad relative time {value!r} (e.g. +30m, +2h, +1d2h)") from None
    try:
        return float(v)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(v).timestamp()
    except ValueError:
        raise UsageError(f"bad time {value!r}: use now, +2h, epoch seconds or ISO 8601") from None


def parse_end(end: str | None, duration: str | None, start: float) -> float:
    """A plan's end: ``--end`` (a time; ``+X`` counts from the start) or else ``--duration``
    (``24h``, ``+24h``, ``1d2h``; a time such as an ISO date is accepted too)."""
    if end:
        return parse_time(end, now=start if end.strip().startswith("+") else None)
    d = (duration or "24h").strip()
    try:
        return start + parse_duration(d)
    except UsageError:
        pass
    try:
        return parse_time(d, now=start)
    except UsageError:
        raise UsageError(f"bad duration {duration!r}: use e.g. 24h, 90m, 1d2h "
                         "(or --end with a time)") from None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The closest of ``choices`` to a mistyped ``word`` ("" if none is close): difflib's
    ratio, the same measure argparse uses for its own suggestions."""
    import difflib

    near = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return near[0] if near else ""


def one_line(text: object, limit: int = 300) -> str:
    """A message on one line (YAML and pydantic errors span several), cut at ``limit``."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def load_spec_file(path: str) -> dict[str, Any]:
    """A spec file's mapping, or UsageError (exit 2, one line): unreadable, larger than
    MAX_SPEC_FILE_BYTES (refused before parsing), not UTF-8 text, or not YAML."""
    import yaml

    cap = MAX_SPEC_FILE_BYTES
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(cap + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(cap + 1)
    except OSError as e:
        raise UsageError(f"cannot read spec file {path}: {e.strerror}") from None
    if len(raw) > cap:
        raise UsageError(f"spec file {path} is larger than {cap // 1024} KiB; a job spec is"
                         " a few lines (put code in --workdir, not in the spec)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"spec file {path} is not UTF-8 text (binary file?)") from None
    if "\0" in text:
        raise UsageError(f"spec file {path} contains NUL bytes (binary file?)")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"spec file {path} is not valid YAML: {one_line(e)}") from None
    except RecursionError:
        raise UsageError(f"spec file {path} is nested too deeply") from None
    if not isinstance(data, dict):
        raise UsageError(f"spec file {path} must hold a mapping of job spec fields")
    return data


def given_flags(args: argparse.Namespace, pairs: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``{field: value}`` for each ``(flag, field)`` whose flag was given (is not None)."""
    return {field: getattr(args, flag) for flag, field in pairs
            if getattr(args, flag) is not None}


def print_line(out: Console, line: Any) -> None:
    """One history line: cut at the width on a terminal (one line each), whole and
    wrapped between words in a pipe (render.full_values)."""
    if render.full_values():
        out.print(line, overflow="fold")
    else:
        out.print(line, no_wrap=True, overflow="ellipsis", crop=True)


def show_list(args: argparse.Namespace, out: Console, items: Any, empty: str,
              table: Callable[[Any], Any]) -> int:
    """A list command's answer: JSON with ``-o json``, else ``empty`` or the table."""
    if args.output == "json":
        out.print_json(render.to_json(items))
    elif not items:
        out.print(empty)
    else:
        out.print(table(render.scrub(list(items))))
    return EXIT_OK
