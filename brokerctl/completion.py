"""``brokerctl completion bash|zsh|fish``: shell completion scripts made from the parser.

Why generated from ``build_parser()`` and not written by hand: a new command or flag is
completed the day it is added, and a test checks that every command is in each script.
The scripts complete commands, then the flags of the command typed (and the global
flags); values are left to the shell's file completion.
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def command_flags(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    """(global flags, {command: its flags}) of the brokerctl parser."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    global_flags = sorted(o for a in parser._actions for o in a.option_strings
                          if o.startswith("--"))
    commands: dict[str, list[str]] = {}
    for name, sp in sub.choices.items():
        flags = {o for a in sp._actions for o in a.option_strings if o.startswith("--")
                 and a.help != argparse.SUPPRESS}
        for child in (a for a in sp._actions if isinstance(a, argparse._SubParsersAction)):
            for cname, csp in child.choices.items():
                flags.add(cname)  # teams set|list|get, plans create|cancel, ...
                flags |= {o for a in csp._actions for o in a.option_strings if o.startswith("--")}
        commands[name] = sorted(flags)
    return global_flags, commands


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    global_flags, commands = command_flags(parser)
    names = " ".join(commands)
    if shell == "bash":
        cases = "\n".join(f'        {c}) opts="{" ".join(f)}" ;;' for c, f in commands.items())
        return f'''# brokerctl bash completion: eval "$(brokerctl completion bash)"
_brokerctl() {{
    local cur cmd i opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) if [[ " {names} " == *" ${{COMP_WORDS[i]}} "* ]]; then cmd="${{COMP_WORDS[i]}}"; break; fi ;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W "{names} {" ".join(global_flags)}" -- "$cur"))
        return
    fi
    case "$cmd" in
{cases}
        *) opts="" ;;
    esac
    COMPREPLY=($(compgen -W "$opts {" ".join(global_flags)}" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
}}
complete -F _brokerctl brokerctl
'''
    if shell == "zsh":
        cases = "\n".join(f"        {c}) compadd -- {' '.join(f)} ;;" for c, f in commands.items())
        return f'''#compdef brokerctl
# brokerctl zsh completion: eval "$(brokerctl completion zsh)"
_brokerctl() {{
    local cmd=""
    local w
    for w in ${{words[2,CURRENT-1]}}; do
        case " {names} " in
            *" $w "*) cmd=$w; break ;;
        esac
    done
    if [[ -z $cmd ]]; then
        compadd -- {names} {" ".join(global_flags)}
        return
    fi
    case $cmd in
{cases}
    esac
    _files
}}
compdef _brokerctl brokerctl
'''
    if shell == "fish":
        lines = ["# brokerctl fish completion: brokerctl completion fish | source",
                 "complete -c brokerctl -f"]
        lines += [f"complete -c brokerctl -n __fish_use_subcommand -a {c}" for c in commands]
        lines += [f"complete -c brokerctl -l {g.lstrip('-')}" for g in global_flags]
        for c, flags in commands.items():
            for f in flags:
                if f.startswith("--"):
                    lines.append(f"complete -c brokerctl -n '__fish_seen_subcommand_from {c}'"
                                 f" -l {f.lstrip('-')}")
                else:
                    lines.append(f"complete -c brokerctl -n '__fish_seen_subcommand_from {c}'"
                                 f" -a {f}")
        return "\n".join(lines) + "\n"
    raise ValueError(shell)
