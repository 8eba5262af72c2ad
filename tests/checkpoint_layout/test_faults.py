"""One test per row of the store fault table (checkpoint_layout/faults.py, shown in
docs/contracts.md "Store faults"): each error is produced for real (a moto S3 server
that is stopped and really refuses connections, a name under .invalid, a loopback
socket that resets or never answers, a loopback HTTP server answering an S3 error
document, boto3 without credentials, the kernel's own OSErrors), then classified."""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from checkpoint_layout.faults import RULES, FaultClass, classify, is_outage
from tests.fixtures.s3_server import S3Server


def _client(endpoint: str, *, creds: bool = True, read_timeout: float = 5.0) -> Any:
    import boto3
    from botocore.config import Config

    kw: dict[str, str] = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"} if creds else {}
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=2,
                      read_timeout=read_timeout, s3={"addressing_style": "path"}), **kw)


def _raised(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the error is what the test is about
        return exc
    raise AssertionError("expected an error")


def _list(endpoint: str, **kw: Any) -> BaseException:
    return _raised(lambda: _client(endpoint, **kw).list_objects_v2(Bucket="b", MaxKeys=1))


@contextmanager
def _http(status: int, code: str) -> Iterator[str]:
    """A loopback HTTP server answering every request with an S3 error document."""

    class H(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{code} from the test server</Message></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PUT = do_HEAD = do_POST = _answer

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@contextmanager
def _socket_server(reset: bool) -> Iterator[str]:
    """Accepts connections; ``reset``: closes each at once with RST; else never answers."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        ls.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = ls.accept()
            except OSError:
                continue
            if reset:
                c.recv(65536)
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.close()
            else:
                held.append(c)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{ls.getsockname()[1]}"
    finally:
        stop.set()
        for c in held:
            c.close()
        ls.close()


def refused(stopped_s3: str) -> BaseException:
    return _list(stopped_s3)


@dataclass(frozen=True)
class Case:
    row: str
    make: Callable[[dict[str, Any]], BaseException]


def _status(status: int, code: str) -> Callable[[dict[str, Any]], BaseException]:
    def make(_: dict[str, Any]) -> BaseException:
        with _http(status, code) as url:
            return _list(url)
    return make


def _reset(_: dict[str, Any]) -> BaseException:
    with _socket_server(reset=True) as url:
        return _list(url)


def _silent(_: dict[str, Any]) -> BaseException:
    with _socket_server(reset=False) as url:
        return _list(url, read_timeout=0.5)


def _no_credentials(ctx: dict[str, Any]) -> BaseException:
    mp: pytest.MonkeyPatch = ctx["monkeypatch"]
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        mp.delenv(k, raising=False)
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    mp.setenv("AWS_CONFIG_FILE", "/nonexistent")
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return _list(ctx["s3"].endpoint_url, creds=False)


def _no_bucket(ctx: dict[str, Any]) -> BaseException:
    s3: S3Server = ctx["s3"]
    return _raised(lambda: s3.client().list_objects_v2(Bucket="no-such-bucket-for-faults"))


def _enospc(ctx: dict[str, Any]) -> BaseException:
    # A full disk, from the kernel: /dev/full answers every write with ENOSPC.
    def write() -> None:
        with open("/dev/full", "wb", buffering=0) as f:
            f.write(b"x")
    return _raised(write)


def _read_only(ctx: dict[str, Any]) -> BaseException:
    # sysfs: no process, root included, may create a directory there (EPERM).
    return _raised(lambda: Path("/sys/cb-fault-test").mkdir())


CASES = [
    Case("name does not resolve (DNS)", lambda ctx: _list("http://cb-store.invalid:9000")),
    Case("connection refused", lambda ctx: refused(ctx["stopped"])),
    Case("connection reset or closed", _reset),
    Case("timeout or network down", _silent),
    Case("throttling", _status(503, "SlowDown")),
    Case("not implemented (501)", _status(501, "NotImplemented")),
    Case("server error (5xx)", _status(500, "InternalError")),
    Case("local store full", _enospc),
    Case("no credentials", _no_credentials),
    Case("access denied or bad credentials", _status(403, "AccessDenied")),
    Case("no such bucket", _no_bucket),
    Case("wrong region or endpoint", _status(400, "IllegalLocationConstraintException")),
    Case("local store not writable", _read_only),
    Case("other client error (4xx)", _status(400, "InvalidBucketName")),
]


@pytest.fixture(scope="module")
def stopped_s3() -> Iterator[str]:
    """A moto S3 server that answered, then was stopped: its port refuses connections."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    _client(url).list_buckets()  # it answered
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    yield url


def test_every_row_has_a_case() -> None:
    assert [c.row for c in CASES] == [r.name for r in RULES]


@pytest.mark.parametrize("case", CASES, ids=[c.row for c in CASES])
def test_row(case: Case, stopped_s3: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    exc = case.make({"stopped": stopped_s3, "s3": s3_server, "monkeypatch": monkeypatch})
    rule = classify(exc)
    assert rule is not None, f"{type(exc).__name__}: {exc}"
    assert rule.name == case.row, f"{type(exc).__name__}: {exc}"
    assert is_outage(exc) is (rule.fault is FaultClass.OUTAGE)


def test_unknown_errors_are_not_store_faults() -> None:
    assert classify(ValueError("not a store error")) is None
    assert classify(OSError(errno.ENOENT, "missing")) is None  # a pruned file: ResumeUnavailable
    assert not is_outage(KeyError("x"))


def test_wrapped_outage_is_found_through_causes(stopped_s3: str) -> None:
    """DCP and s3transfer wrap the store's error: the cause still decides."""
    inner = refused(stopped_s3)
    try:
        try:
            raise inner
        except BaseException as e:
            raise RuntimeError("save failed") from e
    except RuntimeError as outer:
        assert is_outage(outer)


def test_faults_module_does_not_import_botocore() -> None:
    """Agents import the table at start; it names exception classes instead."""
    import subprocess
    import sys

    code = ("import sys, checkpoint_layout.faults; "
            "print('botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert out.stdout.strip() == "False"


def test_docs_table_shows_every_row_in_order() -> None:
    """docs/contracts.md "Store faults" is this table, row for row, class for class."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    section = doc[doc.index("### Store faults"):]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| row")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[:len(RULES)]]
    assert [r[0] for r in rows] == [r.name for r in RULES]
    for cells, rule in zip(rows, RULES, strict=True):
        assert cells[1].startswith(rule.fault.value), (cells, rule.fault)


def test_faulty_proxy_refuse_is_a_real_outage(s3_server: S3Server) -> None:
    """The fault campaign's store outage (tests/fixtures/faulty_proxy.py ``refuse``): the
    proxy's port refuses new connections and resets open ones, classified as an outage;
    after ``accept`` the same endpoint serves the same bucket again."""
    from tests.fixtures.faulty_proxy import FaultyProxy

    bucket = s3_server.unique_bucket("cb-refuse")
    with FaultyProxy(s3_server.endpoint_url) as proxy:
        c = _client(proxy.endpoint_url)
        c.put_object(Bucket=bucket, Key="k", Body=b"v")  # a keep-alive connection is open
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
        exc = _raised(lambda: c.get_object(Bucket=bucket, Key="k"))
        assert is_outage(exc), f"{type(exc).__name__}: {exc}"
        proxy.accept()
        assert c.get_object(Bucket=bucket, Key="k")["Body"].read() == b"v"
