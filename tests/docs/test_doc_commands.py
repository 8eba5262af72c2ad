"""Every `brokerctl ...` command line the README and the docs show still parses.

Why: users copy commands from the docs. A renamed or removed flag must fail here, not
in a new user's shell. Each line of every shell block on every page (and of the
walkthrough script the operator guide shows) goes through brokerctl's real argparse
parser (`brokerctl agent ...` through the agent's own parser, as brokerctl hands it on).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from brokerctl.main import build_parser
from tests.docs.doc_text import ROOT, brokerctl_argv, brokerctl_lines, command_lines

WALKTHROUGH = ROOT / "examples" / "walkthrough.sh"
ARRAY = re.compile(r"^\$\{\w+\[@\]\}$")  # "${flags[@]}": zero or more words, none here


def all_lines() -> list[tuple[str, list[str]]]:
    script = [("examples/walkthrough.sh", p[0]) for line in command_lines(WALKTHROUGH.read_text())
              if (p := brokerctl_argv(line)) is not None]
    return [(where, [w for w in argv if not ARRAY.match(w)]) for where, argv in brokerctl_lines() + script]


def parse(argv: list[str]) -> None:
    if argv and argv[0] == "agent":
        from region_agents.agent import build_parser as agent_parser

        agent_parser().parse_args(argv[1:])
        return
    args = build_parser().parse_args(argv)
    assert args.cmd == argv[0] or argv[0].startswith("-"), argv


def test_the_docs_have_brokerctl_lines_to_check() -> None:
    commands = {argv[0] for _, argv in all_lines() if argv}
    assert {"serve", "agent", "dev-ca", "teams", "submit", "plans", "apply", "jobs", "drain", "sim",
            "console", "migrations"} <= commands, commands


@pytest.mark.parametrize("where, argv", all_lines(),
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_doc_brokerctl_line_parses(where: str, argv: list[str]) -> None:
    try:
        parse(argv)
    except SystemExit as e:  # the agent's parser exits on a bad flag
        raise AssertionError(f"{where}: `brokerctl {' '.join(argv)}` no longer parses") from e


def test_readme_quickstart_scripts_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    scripts = re.findall(r"bash (scripts/\S+\.sh|examples/\S+\.sh)", readme)
    assert {"scripts/demo.sh", "scripts/test.sh", "examples/walkthrough.sh"} <= set(scripts), scripts
    for s in scripts:
        assert (ROOT / s).is_file(), s
        assert subprocess.run(["bash", "-n", str(ROOT / s)], check=False).returncode == 0, s
    for flag in set(re.findall(r"`brokerctl demo (--[a-z0-9-]+)`", readme)) - {"--help"}:
        assert build_parser().parse_args(["demo", flag]).cmd == "demo", flag


def _options(argv: list[str]) -> tuple[str, set[str]] | None:
    """(the command named, the flags it and brokerctl's global level accept), following
    nested subcommands (`teams set`, `plans create`); None if the command does not exist."""
    import argparse

    def subs(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next((dict(a.choices) for a in p._actions if isinstance(a, argparse._SubParsersAction)), {})

    parser = build_parser()
    flags = {o for a in parser._actions for o in a.option_strings}
    words = [w for w in argv if not w.startswith("-")]
    if not words or re.fullmatch(r"[A-Z_]+|\.\.\.", words[0]):
        return "brokerctl", flags  # no command, or a placeholder for any (`brokerctl COMMAND`)
    if words[0] == "agent":
        from region_agents.agent import build_parser as agent_parser

        return "agent", flags | {o for a in agent_parser()._actions for o in a.option_strings}
    node, name = parser, []
    for w in words:
        choices = subs(node)
        if w not in choices:
            break
        node, name = choices[w], [*name, w]
    if not name:
        return None
    return " ".join(name), flags | {o for a in node._actions for o in a.option_strings}


def inline_commands() -> list[tuple[str, list[str]]]:
    """`brokerctl ...` spans in the prose of README and docs pages (not code blocks).

    Prose names commands partially (`brokerctl logs ID -f`, `submit --workdir DIR -- CMD`),
    so these are checked for what can drift: the command exists and every --flag it shows
    is one that command takes."""
    import shlex

    from tests.docs.doc_text import FENCE, pages, rel

    out = []
    for page in pages():
        if page.name == "cli.md":
            continue  # generated from the parser itself
        prose = FENCE.sub("", page.read_text())
        for span in re.findall(r"`(brokerctl [^`]+)`", " ".join(prose.split())):
            try:
                words = shlex.split(span)[1:]
            except ValueError:
                continue
            if "--" in words:
                words = words[: words.index("--")]  # the user's own command follows
            out.append((rel(page), words))
    return out


def test_prose_commands_name_real_commands_and_flags() -> None:
    bad = []
    checked = inline_commands()
    assert len(checked) > 30, checked
    for where, words in checked:
        found = _options(words)
        if found is None:
            bad.append(f"{where}: `brokerctl {' '.join(words)}`: no such command")
            continue
        unknown = [w.split("=", 1)[0] for w in words if w.startswith("--")
                   and w.split("=", 1)[0] not in found[1]]
        if unknown:
            bad.append(f"{where}: `brokerctl {' '.join(words)}`: {found[0]} has no {unknown}")
    assert not bad, "\n".join(bad)
