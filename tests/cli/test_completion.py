"""Shell completion scripts, made from the parser: bash is run for real (the script is
sourced and its completion function called as bash would); zsh and fish are not
installed on the test machines, so their scripts are checked for every command and flag."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from brokerctl.completion import command_flags
from brokerctl.main import build_parser
from tests.cli.conftest import run_cli


def complete_bash(script: str, words: list[str]) -> list[str]:
    """COMPREPLY for the command line ``words`` (the last one is being completed)."""
    quoted = " ".join(f"'{w}'" for w in words)
    prog = (f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; _brokerctl;"
            ' printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_bash_completes_commands_and_the_flags_of_the_command_typed(capsys) -> None:
    assert shutil.which("bash"), "bash is needed to run the bash completion"
    rc, script, err = run_cli(capsys, "completion", "bash")
    assert rc == 0, err
    assert complete_bash(script, ["brokerctl", "su"]) == ["submit"]
    assert "status" in complete_bash(script, ["brokerctl", "st"])
    flags = complete_bash(script, ["brokerctl", "submit", "--ste"])
    assert flags == ["--step-sleep", "--steps"], flags
    assert complete_bash(script, ["brokerctl", "--context", "x", "jobs", "--mi"]) == ["--mine"]
    assert "create" in complete_bash(script, ["brokerctl", "plans", "cr"])


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_every_command_and_flag(capsys, shell: str) -> None:
    rc, script, err = run_cli(capsys, "completion", shell)
    assert rc == 0, err
    _, commands = command_flags(build_parser())
    for cmd, flags in commands.items():
        assert cmd in script, cmd
        for f in flags:
            assert f.lstrip("-") in script, (cmd, f)
