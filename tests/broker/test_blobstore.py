"""Conformance of the workdir blob stores: the local directory and S3 (moto's server).

Both must: round-trip bytes by digest, refuse bytes that do not hash to the announced
digest or size (and then hold nothing under that name), say "absent" without error,
and accept the same blob twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.workdirs.blobstore import (
    BlobError,
    DigestMismatch,
    LocalBlobStore,
    S3BlobStore,
    default_store_url,
    open_blob_store,
)


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def chunks(data: bytes, n: int = 1000) -> Iterator[bytes]:
    for i in range(0, len(data), n):
        yield data[i:i + n]


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "blobs")
    s3 = request.getfixturevalue("s3_server")
    bucket = s3.create_bucket(s3.unique_bucket("cb-wd"))
    return S3BlobStore(f"s3://{bucket}/workdirs", client=s3.client())


def test_round_trip(store: Any) -> None:
    data = bytes(range(256)) * 41
    d = digest_of(data)
    assert store.size(d) is None
    assert store.put(d, len(data), chunks(data)) == len(data)
    assert store.size(d) == len(data)
    assert b"".join(store.read(d, 777)) == data
    # Same blob again (two clients racing, or a retry): fine, same bytes.
    assert store.put(d, len(data), chunks(data)) == len(data)
    assert b"".join(store.read(d)) == data


def test_wrong_digest_leaves_nothing(store: Any) -> None:
    data = b"print('hello')\n" * 100
    wrong = digest_of(b"something else")
    with pytest.raises(DigestMismatch, match="hash to"):
        store.put(wrong, len(data), chunks(data))
    assert store.size(wrong) is None
    with pytest.raises(KeyError):
        store.read(wrong)


def test_size_mismatch_refused(store: Any) -> None:
    data = b"x" * 5000
    d = digest_of(data)
    with pytest.raises(BlobError, match="longer than"):
        store.put(d, 100, chunks(data))
    with pytest.raises(BlobError, match="ended after"):
        store.put(d, 6000, chunks(data))
    assert store.size(d) is None


def test_bad_digest_format(store: Any) -> None:
    with pytest.raises(BlobError, match="sha256:<64"):
        store.size("md5:abc")


def test_open_and_default_urls(tmp_path: Path) -> None:
    assert default_store_url(f"sqlite:///{tmp_path}/b.sqlite") == str(tmp_path / "workdirs")
    assert isinstance(open_blob_store(str(tmp_path / "x")), LocalBlobStore)
    assert isinstance(open_blob_store(f"file://{tmp_path}/y"), LocalBlobStore)
    with pytest.raises(BlobError, match="directory or s3://"):
        open_blob_store("gs://bucket/x")


def test_broker_config_checks_workdir_store() -> None:
    from pydantic import ValidationError

    from broker.config import BrokerConfig

    assert BrokerConfig(workdir_store="s3://b/p").workdir_store == "s3://b/p"
    for bad in ("gs://b/p", "s3:///p"):
        with pytest.raises(ValidationError, match="workdir_store"):
            BrokerConfig(workdir_store=bad)
