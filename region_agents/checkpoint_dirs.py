"""Where a checkpoint mover reads and writes: a local directory or an S3 prefix, behind
one small interface (sizes, read, size, write_durable, delete, cleanup) that
``transfer.py``'s copier picks its method by.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

from checkpoint_layout import check_scheme, split_s3_uri
from checkpoint_layout.retry import error_code

__all__ = ["LocalDir", "S3Dir", "fsync_dir", "fsync_file", "place"]


class LocalDir:
    """A checkpoint directory on a local (or mounted) file system."""

    kind = "local"

    def __init__(self, uri: str) -> None:
        self.path = Path(uri.removeprefix("file://")).absolute()
        self.uri = str(self.path)

    def file(self, name: str) -> Path:
        return self.path / name

    def sizes(self) -> dict[str, int]:
        if not self.path.is_dir():
            return {}
        return {
            p.relative_to(self.path).as_posix(): p.stat().st_size
            for p in self.path.rglob("*")
            if p.is_file()
        }

    def read(self, name: str) -> bytes | None:
        try:
            return self.file(name).read_bytes()
        except FileNotFoundError:
            return None

    def size(self, name: str) -> int | None:
        try:
            return self.file(name).stat().st_size
        except FileNotFoundError:
            return None

    def write_durable(self, name: str, data: bytes) -> None:
        path = self.file(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def delete(self, names: list[str]) -> None:
        for n in names:
            with contextlib.suppress(OSError):
                self.file(n).unlink()

    def cleanup(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class S3Dir:
    """A checkpoint directory: a prefix in an S3 bucket."""

    kind = "s3"

    def __init__(self, uri: str, client: Any) -> None:
        self.bucket, self.prefix = split_s3_uri(uri)
        self.uri = uri.rstrip("/")
        self.client = client

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def sizes(self) -> dict[str, int]:
        base = self.key("")
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=base
        )
        return {o["Key"][len(base) :]: int(o["Size"]) for p in pages for o in p.get("Contents", [])}

    def read(self, name: str) -> bytes | None:
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        except Exception as exc:  # noqa: BLE001
            if error_code(exc)[0] in {"NoSuchKey", "404"} or error_code(exc)[1] == 404:
                return None
            raise

    def head(self, name: str) -> dict[str, Any] | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=self.key(name))
        except Exception as exc:  # noqa: BLE001
            if error_code(exc)[1] == 404:
                return None
            raise

    def size(self, name: str) -> int | None:
        h = self.head(name)
        return None if h is None else int(h["ContentLength"])

    def write_durable(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.key(name), Body=data)

    def delete(self, names: list[str]) -> None:
        if len(names) == 1:
            self.client.delete_object(Bucket=self.bucket, Key=self.key(names[0]))
            return
        for i in range(0, len(names), 1000):
            objs = [{"Key": self.key(n)} for n in names[i : i + 1000]]
            with contextlib.suppress(Exception):
                self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True}
                )

    def cleanup(self) -> None:
        """Delete everything under the dir and abort multipart uploads left behind."""
        with contextlib.suppress(Exception):
            self.delete(list(self.sizes()))
        with contextlib.suppress(Exception):
            ups = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.key(""))
            for u in ups.get("Uploads", []):
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"]
                )


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def place(uri: str, client: Any) -> LocalDir | S3Dir:
    """The directory a checkpoint URI names (``s3://`` or a local path)."""
    check_scheme(uri)
    return S3Dir(uri, client) if uri.startswith("s3://") else LocalDir(uri)
