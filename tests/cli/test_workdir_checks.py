"""A workdir is checked at submit, not by every region later: links the regions refuse,
what .gitignore leaves out, and the size that was uploaded (real broker on loopback)."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from brokersdk.workdir import WorkdirError, pack
from tests.cli.conftest import TEAM, run_cli


def project(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "src" / "model.py").write_text("X = 1\n")
    return root


def names(tmp_path: Path, root: Path) -> list[str]:
    tar = tmp_path / "w.tar"
    pack(root).write_to(tar)
    with tarfile.open(tar) as t:
        return sorted(t.getnames())


def test_an_absolute_symlink_is_refused_at_pack_with_its_name(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    os.symlink("/etc/hostname", root / "src" / "host")
    with pytest.raises(WorkdirError, match=r"src/host -> /etc/hostname: .*point down"):
        pack(root)


def test_a_symlink_pointing_up_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    (tmp_path / "outside.txt").write_text("x")
    os.symlink("../../outside.txt", root / "src" / "out")
    with pytest.raises(WorkdirError, match=r"src/out -> ../../outside.txt: .*point down"):
        pack(root)


def test_a_relative_symlink_down_into_the_tree_is_packed(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    os.symlink("src/model.py", root / "model_link.py")
    assert "model_link.py" in names(tmp_path, root)


def test_an_ignored_absolute_symlink_is_not_checked(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    os.symlink("/etc/hostname", root / "host")
    (root / ".brokerignore").write_text("host\n")
    assert "host" not in names(tmp_path, root)


def test_gitignore_is_honoured_with_brokerignore(tmp_path: Path) -> None:
    root = project(tmp_path / "p")
    for d in ("data", "logs", "checkpoints/step-1", "src/build"):
        (root / d).mkdir(parents=True)
        (root / d / "blob").write_text("x" * 100)
    (root / "run.log").write_text("log")
    (root / "notes.tmp").write_text("tmp")
    (root / ".gitignore").write_text("data/\nlogs/\n*.log\n/checkpoints/\nbuild/\n")
    (root / ".brokerignore").write_text("*.tmp\n")
    got = names(tmp_path, root)
    assert got == [".gitignore", "src/model.py", "train.py"], got


def test_submit_refuses_a_bad_link_and_shows_the_upload_size(capsys, broker_address: str,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    root = project(tmp_path / "p")
    os.symlink("/etc/hostname", root / "host")
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "w",
                           "--team", TEAM, "--workdir", str(root), "--", "python", "train.py")
    assert rc == 2 and "host -> /etc/hostname" in err and "point down" in err, err
    assert "submitted" not in out
    (root / "host").unlink()
    rc, out, err = run_cli(capsys, "--broker", broker_address, "submit", "--name", "w",
                           "--team", TEAM, "--workdir", str(root), "--", "python", "train.py")
    assert rc == 0, err
    assert "workdir uploaded: " in out and "KiB" in out and ".gitignore" in out, out
