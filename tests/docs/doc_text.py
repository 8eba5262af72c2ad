"""Read the README and the docs site's pages the way a user copies from them.

Why one module: the docs tests (commands parse, the walkthrough runs, no internal
references) must agree on what a page, a code block and a command line are.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def pages() -> list[Path]:
    """README.md and every Markdown page of the site (docs/, recursively)."""
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(text: str) -> list[tuple[str, str, str]]:
    """(heading above, language, body) of every fenced block of a page."""
    out = []
    for m in FENCE.finditer(text):
        heading = next((h for h in re.findall(r"^#+ (.+)$", text[: m.start()], re.M)[::-1]), "")
        out.append((heading, m.group(1), m.group(2)))
    return out


def command_lines(body: str) -> list[str]:
    """Shell lines of a block, continuation lines joined, `$ ` prompts dropped."""
    lines, cur = [], ""
    for raw in body.splitlines():
        cur += raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        line = cur.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line:
            lines.append(line)
        cur = ""
    return lines


def brokerctl_argv(line: str) -> tuple[list[str], bool] | None:
    """argv after `brokerctl` and whether the line runs in the background (&)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    if not words or words[0] != "brokerctl":
        return None
    background = words[-1] == "&"
    return (words[1:-1] if background else words[1:]), background


def shell_blocks(text: str) -> list[tuple[str, str]]:
    """(heading, body) of the shell blocks of a page (bash, sh, console or untagged)."""
    return [(h, body) for h, lang, body in blocks(text) if lang in ("bash", "sh", "console", "")]


def brokerctl_lines() -> list[tuple[str, list[str]]]:
    """("page: heading", argv) of every `brokerctl ...` line in a shell block of any page.

    Generated usage blocks (```text) are not commands; `brokerctl sub ARGS` in prose is
    not either. Shell variables stay as written (they parse as plain words)."""
    out = []
    for page in pages():
        for heading, body in shell_blocks(page.read_text()):
            for line in command_lines(body):
                parsed = brokerctl_argv(line)
                if parsed is not None:
                    out.append((f"{rel(page)}: {heading}", parsed[0]))
    return out
