"""The agent's side of workdirs: fetch by digest from a real broker (verified, cached
once per digest), unpack per attempt, and never outside the attempt's directory."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from region_agents.workdir import WorkdirCache, WorkdirFetchError, unpack
from tests.broker.harness import Broker, fast_config


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(fast_config(tmp_path))
    yield b
    b.stop()


def test_fetch_cache_unpack(broker: Broker, tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "pkg" / "m.py").write_text("X = 1\n")
    with BrokerClient(broker.address) as c:
        ref = c.upload_workdir(str(code))
    cache = WorkdirCache(tmp_path / "agent", lambda: broker.agent_address,
                         broker.pki.agent_credentials("test-region", "test-agent"))
    tar = cache.get(ref.digest)
    assert tar.stat().st_size == ref.size_bytes
    broker.server.blobs.read = None  # a second get must not touch the broker
    assert cache.get(ref.digest) == tar
    for attempt in (1, 2):  # each attempt gets its own fresh copy
        out = unpack(tar, tmp_path / f"attempt-{attempt}" / "workdir")
        assert (out / "pkg" / "m.py").read_text() == "X = 1\n"
    with pytest.raises(WorkdirFetchError, match="not stored"):
        cache.get("sha256:" + "3" * 64)
    with pytest.raises(WorkdirFetchError, match="not sha256"):
        cache.get("md5:1")


def test_unpack_refuses_paths_outside(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 3
        t.addfile(info, io.BytesIO(b"bad"))
    with pytest.raises(WorkdirFetchError, match="cannot unpack"):
        unpack(bad, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


def test_unpack_keeps_modes_and_inner_links(tmp_path: Path) -> None:
    from brokersdk.workdir import pack

    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "bin" / "run.sh").chmod(0o755)
    (src / "big.bin").write_bytes(bytes(range(256)) * 8192)  # 2 MiB: several copy ranges
    (src / "link").symlink_to("bin/run.sh")
    packed = pack(src)
    packed.write_to(tmp_path / "w.tar")
    out = unpack(tmp_path / "w.tar", tmp_path / "out")
    assert (out / "bin" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (out / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (out / "link").is_symlink() and (out / "link").read_text() == "#!/bin/sh\necho hi\n"


def test_pack_refuses_links_the_agent_would_refuse(tmp_path: Path) -> None:
    """An upward or absolute link is refused when packing, naming it, instead of
    failing every launch on the agent (region_agents/safe_untar.py keeps only links
    pointing down into the tree)."""
    from brokersdk.workdir import WorkdirError, pack

    for target in ("../outside.txt", "/etc/hostname", "sub/../../x"):
        src = tmp_path / f"src-{len(target)}"
        (src / "sub").mkdir(parents=True)
        (src / "sub" / "link").symlink_to(target)
        with pytest.raises(WorkdirError, match=r"sub/link -> .*point down"):
            pack(src)
