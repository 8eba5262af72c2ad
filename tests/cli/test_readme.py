"""The README's command lines, taken from its own text, parse and run.

Why: a new user copies the README. Every ``brokerctl`` line in its code blocks must
parse with the current CLI (flags renamed or removed fail here), the quickstart's
scripts must exist, and the "Run a broker and agents yourself" block plus the CLI
examples block run for real: a broker and an agent as processes (the fixed port in the
text is swapped for a free one, paths point into a temp copy of examples/), then each
example line against that broker must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from brokerctl.main import build_parser, main
from tests.fixtures.cluster import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def blocks() -> list[tuple[str, str, str]]:
    """(heading above, language, body) of every fenced block."""
    out = []
    for m in FENCE.finditer(README):
        heading = next((h for h in re.findall(r"^#+ (.+)$", README[: m.start()], re.M)[::-1]), "")
        out.append((heading, m.group(1), m.group(2)))
    return out


def command_lines(body: str) -> list[str]:
    """Shell lines of a block, continuation lines joined, comments dropped."""
    lines, cur = [], ""
    for raw in body.splitlines():
        cur += raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        if cur.strip():
            lines.append(cur.strip())
        cur = ""
    return lines


def brokerctl_argv(line: str) -> tuple[list[str], bool] | None:
    """argv after `brokerctl` and whether the line runs in the background (&)."""
    words = shlex.split(line, comments=True)
    if not words or words[0] != "brokerctl":
        return None
    background = words[-1] == "&"
    return (words[1:-1] if background else words[1:]), background


def readme_brokerctl_lines() -> list[tuple[str, list[str]]]:
    out = []
    for heading, lang, body in blocks():
        if lang not in ("bash", "sh", ""):
            continue
        for line in command_lines(body):
            if line.startswith("$ "):
                line = line[2:]
            parsed = brokerctl_argv(line)
            if parsed is not None:
                out.append((heading, parsed[0]))
    return out


def test_the_readme_has_brokerctl_lines_to_check() -> None:
    commands = {argv[0] for _, argv in readme_brokerctl_lines() if argv}
    assert {"serve", "agent", "teams", "submit", "plans", "apply", "jobs", "drain"} <= commands, commands


@pytest.mark.parametrize("heading, argv", readme_brokerctl_lines(),
                         ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_every_readme_brokerctl_line_parses(heading: str, argv: list[str]) -> None:
    if argv and argv[0] == "agent":
        from region_agents.agent import build_parser as agent_parser

        agent_parser().parse_args(argv[1:])
        return
    args = build_parser().parse_args(argv)
    assert args.cmd == argv[0] or argv[0].startswith("-")


def test_quickstart_commands_exist() -> None:
    quick = README[README.index("## Quickstart"):README.index("## Architecture")]
    scripts = re.findall(r"bash (scripts/\S+\.sh)", quick)
    assert "scripts/demo.sh" in scripts and "scripts/test.sh" in scripts
    for s in scripts:
        assert (ROOT / s).is_file(), s
        assert subprocess.run(["bash", "-n", str(ROOT / s)], check=False).returncode == 0
    # The demo flags the quickstart names parse.
    for flag in (set(re.findall(r"`brokerctl demo (--[a-z0-9-]+)`", quick)) | {"--s3", "--no-spot"}) - {"--help"}:
        assert build_parser().parse_args(["demo", flag]).cmd == "demo"


def _block_after(heading: str) -> list[tuple[list[str], bool]]:
    return [(argv, bg) for kind, argv, bg in _steps_after(heading) if kind == "brokerctl"]


def _steps_after(heading: str) -> list[tuple[str, list[str], bool]]:
    """The block's steps: ("export", [KEY, VALUE], False) or ("brokerctl", argv, background)."""
    body = next(b for h, lang, b in blocks() if h == heading and lang == "bash")
    steps: list[tuple[str, list[str], bool]] = []
    for line in command_lines(body):
        words = shlex.split(line, comments=True)
        if words and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            steps.append(("export", [key, value], False))
        elif (p := brokerctl_argv(line)) is not None:
            steps.append(("brokerctl", p[0], p[1]))
    return steps


@pytest.mark.slow
def test_readme_run_it_yourself_and_cli_examples_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    # A new user's shell: none of the suite's own credentials (tests/fixtures/pki.py).
    for key in [k for k in os.environ if k.startswith("CB_") or k == "BROKER_ADDRESS"]:
        monkeypatch.delenv(key, raising=False)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    # The README's fixed ports (TLS :50051, mutual TLS :50052) become free ones.
    ports = {"127.0.0.1:50051": f"127.0.0.1:{free_port()}", "127.0.0.1:50052": f"127.0.0.1:{free_port()}"}
    env = dict(os.environ, COLUMNS="100", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "proto"),
                                           os.environ.get("PYTHONPATH", "")]))
    procs: list[subprocess.Popen[bytes]] = []

    def localized(argv: list[str]) -> list[str]:
        for fixed, free in ports.items():
            argv = [a.replace(fixed, free) for a in argv]
        if argv[0] == "dev-ca" and "--server" not in argv:
            argv += ["--server", ports["127.0.0.1:50051"], "--mtls-server", ports["127.0.0.1:50052"]]
        if argv[0] == "serve" and "--agent-listen" not in argv:
            argv += ["--agent-listen", ports["127.0.0.1:50052"]]
        if argv[0] == "agent" and os.geteuid() == 0 and "--allow-root-jobs" not in argv:
            argv += ["--allow-root-jobs"]  # this test host runs as root (README: run_as_user)
        return argv

    def argv_of(argv: list[str]) -> list[str]:
        return [sys.executable, "-m", "brokerctl", *localized(argv)]

    def run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv_of(argv), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=timeout, check=False)

    try:
        for kind, argv, background in _steps_after("Run a broker and agents yourself"):
            if kind == "export":  # relative paths resolve in tmp_path, the commands' cwd
                value = argv[1].replace("$PWD", str(tmp_path))
                env[argv[0]] = str(tmp_path / value) if "/" in value else value
                continue
            if background:
                log = open(tmp_path / f"{argv[0]}.log", "wb")  # noqa: SIM115 - closed with the process
                procs.append(subprocess.Popen(argv_of(argv), cwd=tmp_path, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
                if argv[0] == "serve":
                    wait_until(lambda: run(["regions"], 30).returncode == 0, timeout=180,
                               what=f"the README's broker answers\n{(tmp_path / 'serve.log').read_text()}")
                else:
                    wait_until(lambda: "connected" in run(["regions"], 30).stdout, timeout=180,
                               what="the README's agent connects")
                continue
            if "--wait" in argv:  # the README's job, shortened (flags override the file)
                argv = [*argv, "--steps", "4", "--checkpoint-every", "2", "--nodes", "1", "--max-nodes", "1"]
            result = run(argv)
            assert result.returncode == 0, (argv, result.stdout[-3000:], result.stderr[-3000:])
            if "--wait" in argv:
                assert "final: succeeded" in result.stdout, result.stdout[-3000:]
        # The CLI examples in-process (brokerctl.main.main, as the console script runs it),
        # with the environment the block above set up (e.g. CB_CONFIG: the admin context).
        monkeypatch.chdir(tmp_path)
        for key in ("CB_CONFIG",):
            if key in env:
                monkeypatch.setenv(key, env[key])
        broker = [] if "CB_CONFIG" in env else ["--broker", ports["127.0.0.1:50051"]]
        for argv, _ in _block_after("CLI (`brokerctl --help`; every list/detail command takes `-o json`)"):
            rc = main([*broker, *localized(argv)])
            out, err = capsys.readouterr()
            assert rc == 0, (argv, out[-3000:], err[-3000:])
            assert "Traceback" not in out + err
            assert all(len(line) <= 100 for line in out.splitlines()), out
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
