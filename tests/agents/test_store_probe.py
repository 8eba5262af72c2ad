"""The agent's start-up probe of its checkpoint store, and path resolution."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from region_agents.store_probe import probe, resolve_store


def test_local_probe(tmp_path: Path) -> None:
    assert probe(str(tmp_path / "new" / "store")) == ""
    assert (tmp_path / "new" / "store").is_dir()
    assert list((tmp_path / "new" / "store").iterdir()) == []  # the probe object is gone
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = probe(str(blocker / "store"))
    assert err.startswith(f"cannot write {blocker / 'store'}")
    assert "unsupported" in probe("gs://bucket/x")
    assert probe("") == ""


def test_s3_probe(s3_server, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    s3_server.apply_env(monkeypatch)
    from region_agents import staging

    monkeypatch.setattr(staging, "_clients", {})
    bucket = s3_server.unique_bucket("cb-probe")
    assert probe(f"s3://{bucket}/ckpt") == ""
    assert s3_server.list_keys(bucket) == []
    err = probe("s3://cb-no-such-bucket-xyz/ckpt")
    assert err.startswith("cannot write s3://cb-no-such-bucket-xyz/ckpt/.cb-probe-")


def test_resolve_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_store("var/ckpt") == str(tmp_path / "var" / "ckpt")
    assert resolve_store("file://var/ckpt") == f"file://{tmp_path / 'var' / 'ckpt'}"
    assert resolve_store("s3://b/p") == "s3://b/p"
    assert os.path.isabs(resolve_store("."))
