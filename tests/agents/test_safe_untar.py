"""The workdir unpacker as an attacker would feed it: the CVE-2025-4517 shape (nested
247-character directories reached through short symlinks, a link climbing ``../`` x16,
a second link through it), planted links, and a hypothesis fuzz over generated tars.
Whatever the tar holds, nothing lands outside the target and no link leads out."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from region_agents import safe_untar
from region_agents.workdir import WorkdirFetchError, unpack


def _add(tar: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, link: str = "",
         data: bytes = b"x") -> None:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    ti.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    if kind == tarfile.REGTYPE:
        ti.size = len(data)
        tar.addfile(ti, io.BytesIO(data))
    else:
        tar.addfile(ti)


def _snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` except ``skip``'s subtree: (mode, size), no links followed."""
    out: dict[str, tuple[int, int]] = {}
    for d, dirs, files in os.walk(root, followlinks=False):
        if Path(d) == skip or skip in Path(d).parents:
            continue
        for n in dirs + files:
            p = Path(d) / n
            if p == skip:
                continue
            s = p.lstat()
            out[str(p)] = (s.st_mode, s.st_size)
    return out


def cve_2025_4517_tar(path: Path) -> None:
    """The published shape: 16 levels of 247-char dirs, each reachable through a short
    symlink, a link climbing out through them, a second link through it, then a file."""
    comp = "d" * 247
    steps = "abcdefghijklmnop"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        cur = ""
        for s in steps:
            _add(tar, os.path.join(cur, comp), tarfile.DIRTYPE)
            _add(tar, os.path.join(cur, s), tarfile.SYMTYPE, comp)
            cur = os.path.join(cur, comp)
        linkpath = os.path.join(*steps, "l" * 254)
        _add(tar, linkpath, tarfile.SYMTYPE, "../" * len(steps))
        _add(tar, "escape", tarfile.SYMTYPE, linkpath + "/../../../..")
        _add(tar, "escape/pwned", data=b"root was here\n")
        _add(tar, "flat", tarfile.LNKTYPE, "escape/pwned")


@pytest.mark.parametrize("name_limit", [safe_untar.MAX_NAME_BYTES, 1 << 16])
def test_cve_2025_4517_shape_lands_nothing_outside(tmp_path: Path, name_limit: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused by the length limit; and with no length limit, by the link rules."""
    monkeypatch.setattr(safe_untar, "MAX_NAME_BYTES", name_limit)
    outer = tmp_path / "outer"
    target = outer / "cache" / "workdir"
    target.parent.mkdir(parents=True)
    (outer / "sentinel").write_text("keep")
    cve_2025_4517_tar(tmp_path / "evil.tar")
    before = _snapshot(tmp_path, target)
    with pytest.raises(WorkdirFetchError, match="over 1024 bytes" if name_limit == 1024 else "climbs"):
        unpack(tmp_path / "evil.tar", target)
    assert _snapshot(tmp_path, target) == before
    assert not list(tmp_path.rglob("pwned"))


def test_planted_link_in_target_is_not_followed(tmp_path: Path) -> None:
    """Someone (an earlier attempt, a job) planted ``pkg -> /outside`` in the target:
    the tar's ``pkg/m.py`` must not be written through it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (target / "pkg").symlink_to(outside)
    (target / "run.py").symlink_to(outside / "run.py")
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        _add(tar, "pkg/m.py", data=b"X=1\n")
    with pytest.raises(WorkdirFetchError, match="not a real directory"):
        unpack(tmp_path / "t.tar", target)
    with tarfile.open(tmp_path / "u.tar", "w") as tar:
        _add(tar, "run.py", data=b"X=1\n")
    with pytest.raises(WorkdirFetchError, match="listed twice|symlink"):
        unpack(tmp_path / "u.tar", target)
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(("name", "kind", "link", "why"), [
    ("/etc/cron.d/x", tarfile.REGTYPE, "", "absolute"),
    ("a/../../x", tarfile.REGTYPE, "", "'..'"),
    ("a/" + "d" * 256 + "/x", tarfile.REGTYPE, "", "component over"),
    ("/".join(["d" * 200] * 6), tarfile.REGTYPE, "", "over 1024"),
    ("up", tarfile.SYMTYPE, "../x", "climbs"),
    ("abs", tarfile.SYMTYPE, "/etc/shadow", "absolute symlink"),
    ("hard", tarfile.LNKTYPE, "a", "hard link"),
    ("dev", tarfile.CHRTYPE, "", "device"),
    ("fifo", tarfile.FIFOTYPE, "", "device, FIFO"),
])
def test_refuses_each_unsafe_member(tmp_path: Path, name: str, kind: bytes, link: str,
                                    why: str) -> None:
    with tarfile.open(tmp_path / "t.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "a", data=b"a")
        _add(tar, name, kind, link)
    with pytest.raises(WorkdirFetchError, match=why):
        unpack(tmp_path / "t.tar", tmp_path / "out")


def test_keeps_downward_links_and_modes(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "t.tar", "w") as tar:
        _add(tar, "./bin", tarfile.DIRTYPE)
        ti = tarfile.TarInfo("bin/run.sh")
        ti.mode, ti.size = 0o4777, 3
        tar.addfile(ti, io.BytesIO(b"#!x"))
        _add(tar, "latest", tarfile.SYMTYPE, "bin/./run.sh")
    out = unpack(tmp_path / "t.tar", tmp_path / "out")
    assert (out / "bin" / "run.sh").stat().st_mode & 0o7777 == 0o755  # no setuid, no o+w
    assert os.readlink(out / "latest") == "bin/./run.sh"
    assert (out / "latest").read_bytes() == b"#!x"


# ---- fuzz ------------------------------------------------------------------------------
_COMPONENTS = st.sampled_from(["a", "b", "l", "a", "b", "l", "..", ".", "", "d" * 247,
                              "x" * 256, "pwned"])
_NAMES = st.lists(_COMPONENTS, min_size=1, max_size=18).map("/".join)
_NAMES = st.one_of(_NAMES, _NAMES, _NAMES.map(lambda n: "/" + n))
_KINDS = st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.SYMTYPE,
                          tarfile.LNKTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE])
_MEMBERS = st.lists(st.tuples(_NAMES, _KINDS, _NAMES), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(members=_MEMBERS)
def test_fuzz_no_member_lands_outside(tmp_path_factory: pytest.TempPathFactory,
                                      members: list[tuple[str, bytes, str]]) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    target = base / "outer" / "target"
    target.parent.mkdir()
    (base / "outer" / "sentinel").write_text("keep")
    with tarfile.open(base / "t.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, link in members:
            try:
                _add(tar, name, kind, link, data=b"pwned")
            except (ValueError, tarfile.TarError):
                continue  # a header tarfile itself cannot write
    before = _snapshot(base, target)
    try:
        unpack(base / "t.tar", target)
        event("extracted whole")
    except WorkdirFetchError:
        event("refused")
    assert _snapshot(base, target) == before, "something changed outside the target"
    for d, dirs, files in os.walk(target, followlinks=False):
        for n in dirs + files:
            p = Path(d) / n
            st_ = p.lstat()
            assert not (st_.st_mode & 0o6000), f"{p} kept a setuid/setgid bit"
            if p.is_symlink():  # the invariant that makes every link stay inside
                t = os.readlink(p)
                assert not t.startswith("/") and ".." not in t.split("/"), (p, t)
            else:
                assert p.is_dir() or p.is_file(), f"{p}: special file extracted"


def test_split_name_normalises_and_refuses() -> None:
    assert safe_untar.split_name("./a//b/.") == ["a", "b"]
    assert safe_untar.split_name(".") == []
    for bad in ("/a", "a/..", "a\x00b", "../a"):
        with pytest.raises(safe_untar.UnsafeMember):
            safe_untar.split_name(bad)
