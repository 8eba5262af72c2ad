"""Issue 12: every bad flag or spec file is one line on stderr and exit status 2, and a
spec file over the size cap is refused before it is parsed. No broker is needed: each
of these is refused before any call (the address points nowhere on purpose)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.api.limits import MAX_SPEC_FILE_BYTES
from brokerctl.main import main

NOWHERE = ["--broker", "127.0.0.1:1", "--timeout", "2"]


def one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main([*NOWHERE, *argv]) == 2
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if not ln.startswith("hint:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("content,needle", [
    (b"\x00\x01\x02\xff\xfe" * 100, "not UTF-8"),
    (b"name: x\x00\nteam: ml\n", "NUL bytes"),
    (b"name: [\nteam: ml\n", "not valid YAML"),
    (b"{a: 1, a: [", "not valid YAML"),
    (b"- just\n- a list\n", "mapping"),
    (b"name: x\nteam: ml\nnodes: 99999999999\n", "out of range"),
    (b"name: x\nteam: ml\nnodes: many\n", "nodes"),
    (b"[" * 5000 + b"]" * 5000, "nested too deeply|not valid YAML"),
], ids=["binary", "nul", "yaml", "yaml2", "list", "int-range", "int-type", "deep"])
def test_bad_spec_files(tmp_path: Path, capsys: pytest.CaptureFixture, content: bytes,
                        needle: str) -> None:
    f = tmp_path / "spec.yaml"
    f.write_bytes(content)
    line = one_line_exit_2(["submit", "-f", str(f)], capsys)
    assert any(n in line for n in needle.split("|")), line


def test_huge_spec_file_is_refused_before_parsing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    def never(*_a: object, **_k: object) -> None:
        raise AssertionError("a spec file over the cap was parsed")

    monkeypatch.setattr(yaml, "safe_load", never)
    f = tmp_path / "huge.yaml"
    f.write_bytes(b"name: x\nlabels:\n" + b"  k: " + b"v" * (MAX_SPEC_FILE_BYTES + 10) + b"\n")
    line = one_line_exit_2(["submit", "-f", str(f)], capsys)
    assert "larger than 1024 KiB" in line


@pytest.mark.parametrize("flags,needle", [
    (["--max-price", "nan"], "finite number"),
    (["--max-price", "inf"], "finite number"),
    (["--step-sleep", "1e400"], "finite number"),
    (["--nodes", "99999999999"], "out of range"),
    (["--nodes", "two"], "invalid int"),
    (["--expected-duration=-inf"], "finite number"),
], ids=["nan", "inf", "overflow-float", "int32", "not-int", "neg-inf"])
def test_bad_flags(capsys: pytest.CaptureFixture, flags: list[str], needle: str) -> None:
    line = one_line_exit_2(["submit", "--team", "ml", "--name", "x", *flags], capsys)
    assert needle in line, line
