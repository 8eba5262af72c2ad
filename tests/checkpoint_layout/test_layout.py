"""checkpoint_layout: names, manifest format, digests, discovery (local dir and S3 via
moto's HTTP server), the retry policy and transient check, and that it stays torch-free."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import xxhash
from botocore.exceptions import ClientError, EndpointConnectionError

import checkpoint_layout as cl
from checkpoint_layout import manifest as mf


# ------------------------------------------------------------------------- torch-free
def test_import_does_not_load_torch_or_boto() -> None:
    """The agent imports this package; it must not pay for torch (nor boto3 at import)."""
    code = (
        "import sys, checkpoint_layout, checkpoint_layout.discovery, checkpoint_layout.s3; "
        "import region_agents.transfer, region_agents.staging; "
        "bad = [m for m in ('torch', 'boto3') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if 'torch' in bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=os.environ.copy(), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch" not in out.stdout


# ------------------------------------------------------------------------------ names
def test_step_names_round_trip_and_uri_parsing() -> None:
    assert cl.step_name(7) == "step-000000007" and cl.parse_step("step-000000007") == 7
    assert cl.parse_step("step-x") is None and cl.parse_step("attempt-1") is None
    assert cl.parse_step(cl.step_name(1234567890)) == 1234567890  # wider than 9 digits
    assert cl.split_step_uri("s3://b/p/step-000000020/") == ("s3://b/p", "step-000000020")
    with pytest.raises(cl.LayoutError, match="step-NNNNNNNNN"):
        cl.split_step_uri("s3://b/p/latest")
    assert cl.split_s3_uri("s3://b/a/b/") == ("b", "a/b") and cl.split_s3_uri("s3://b") == ("b", "")
    with pytest.raises(cl.LayoutError, match="no bucket"):
        cl.split_s3_uri("s3:///x")
    with pytest.raises(ValueError, match="unsupported checkpoint URI"):
        cl.check_scheme("gs://b/x")
    assert cl.normalize("file:///a/b/") == "/a/b" and cl.normalize("s3://b/p/") == "s3://b/p"


# --------------------------------------------------------------------------- manifest
def test_manifest_build_dumps_loads_is_the_trainers_format() -> None:
    m = mf.build({"job_id": "j", "attempt": 2, "model": {"d": 1}}, step=5, samples_seen=40,
                 world_size=2, files={"b": 2, "a": 1}, digests={"a": "AA", "b": "bb"}, created=1.0)
    assert m["manifest_version"] == cl.MANIFEST_VERSION == 3
    assert m["files"] == [{"name": "a", "size": 1, "xxh3_128": "AA"},
                          {"name": "b", "size": 2, "xxh3_128": "bb"}]
    raw = mf.dumps(m)
    assert raw == json.dumps(m, indent=1, sort_keys=True).encode()  # byte-identical on disk
    assert mf.loads(raw) == m
    with pytest.raises(mf.ManifestError, match=r"no digest for files \['c'\]"):
        mf.build({}, step=1, samples_seen=0, world_size=1, files={"c": 1}, digests={})


@pytest.mark.parametrize(
    ("manifest", "needle"),
    [
        ({"manifest_version": 4, "files": []}, "manifest_version 4"),
        ({"files": [{"name": "../x", "size": 1}]}, "invalid file name"),
        ({"files": [{"name": "manifest.json", "size": 1}]}, "invalid file name"),
        ({"files": [{"name": "/etc/passwd", "size": 1}]}, "invalid file name"),
        ({"files": [{"name": "a"}]}, "invalid file entry"),
        ({"files": [{"name": "a", "size": -1}]}, "negative size"),
        ({"step": "7", "files": []}, "invalid step"),
        ({"step": 1}, "no file list"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_manifest_validation_rejects(manifest: Any, needle: str) -> None:
    with pytest.raises(mf.ManifestError, match=needle):
        mf.loads(json.dumps(manifest), "m")


def test_manifest_versions_1_to_3_are_accepted() -> None:
    for v, extra in ((None, {}), (1, {}), (2, {"sha256": "ab"}), (3, {"xxh3_128": "cd"})):
        m = {"step": 1, "files": [{"name": "a", "size": 3, **extra}]}
        if v is not None:
            m["manifest_version"] = v
        assert mf.loads(json.dumps(m))["files"][0]["name"] == "a"
    assert mf.loads(b'{"files": []}') == {"files": []}
    with pytest.raises(mf.ManifestError, match="not valid JSON"):
        mf.loads(b"{")


# ---------------------------------------------------------------------------- digests
def test_digests_match_the_reference_libraries(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert cl.hash_file(p) == xxhash.xxh3_128(data).hexdigest() == cl.hash_bytes(data)
    assert cl.hash_file(p, "sha256") == hashlib.sha256(data).hexdigest()
    assert cl.expected_digest({"xxh3_128": "AB"}) == ("xxh3_128", "ab")
    assert cl.expected_digest({"sha256": "cd", "size": 1}) == ("sha256", "cd")
    assert cl.expected_digest({"checksum": "SHA256:EF"}) == ("sha256", "ef")
    assert cl.expected_digest({"name": "a", "size": 1}) is None and cl.expected_digest(None) is None


# -------------------------------------------------------------------------- discovery
def make(root: Path, step: int, complete: bool = True) -> None:
    d = root / cl.step_name(step)
    d.mkdir(parents=True)
    (d / "x.distcp").write_bytes(b"1")
    if complete:
        (d / cl.MANIFEST).write_text(json.dumps({"step": step, "files": []}))


def test_local_discovery_and_resume_fallback(tmp_path: Path) -> None:
    root = tmp_path / "attempt-1"
    assert cl.list_steps(str(root)) == {} and cl.latest_complete_checkpoint(str(root)) is None
    make(root, 8)
    make(root, 14)
    make(root, 16, complete=False)
    (root / "step-junk").mkdir()
    (root / "notes.txt").write_text("x")
    assert cl.list_steps(f"file://{root}") == {8: True, 14: True, 16: False}
    assert cl.latest_complete_checkpoint(str(root)) == f"{root}/step-000000014"
    exact = cl.resolve_resume(f"{root}/step-000000008")
    assert exact.uri == f"{root}/step-000000008" and not exact.fell_back
    pruned = cl.resolve_resume(f"{root}/step-000000010")  # gone: the newer complete one
    assert pruned.uri == f"{root}/step-000000014" and pruned.fell_back
    with pytest.raises(cl.CheckpointMissing, match=r"step-000000016 is incomplete .* >= 16"):
        cl.resolve_resume(f"{root}/step-000000016")  # never an older one, never a partial one
    with pytest.raises(cl.CheckpointMissing, match="is gone"):
        cl.resolve_resume(f"{tmp_path}/nowhere/step-000000001")


def test_s3_discovery_and_resume_fallback(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("layout")
    c = s3_server.client()
    for key in ("jobs/j/attempt-1/step-000000014/a.distcp",
                "jobs/j/attempt-1/step-000000014/manifest.json",
                "jobs/j/attempt-1/step-000000016/a.distcp",
                "jobs/j/attempt-10/step-000000099/manifest.json",  # a sibling prefix
                "jobs/j/attempt-1/other.txt"):
        c.put_object(Bucket=bucket, Key=key, Body=b"{}")
    base = f"s3://{bucket}/jobs/j/attempt-1"
    client = cl.make_s3_client()
    assert cl.list_steps(base + "/", s3_client=client) == {14: True, 16: False}
    assert cl.latest_complete_checkpoint(base) == f"{base}/step-000000014"
    point = cl.resolve_resume(f"{base}/step-000000010", s3_client=client)
    assert point.uri == f"{base}/step-000000014" and point.fell_back
    with pytest.raises(cl.CheckpointMissing):
        cl.resolve_resume(f"{base}/step-000000015", s3_client=client)


# ------------------------------------------------------------------- retry and S3 setup
def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_transient_errors() -> None:
    assert cl.is_transient(_client_error("SlowDown", 503))
    assert cl.is_transient(_client_error("InternalError", 500))
    assert cl.is_transient(EndpointConnectionError(endpoint_url="http://x"))
    assert cl.is_transient(ConnectionResetError()) and cl.is_transient(TimeoutError())

    class Mine(cl.TransientError):
        pass

    assert cl.is_transient(Mine())
    try:  # the cause counts (boto3 and s3transfer wrap errors)
        try:
            raise _client_error("SlowDown", 503)
        except ClientError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert cl.is_transient(outer)
    try:  # ...but not a context the raiser disowned (`from None`)
        try:
            raise _client_error("SlowDown", 503)
        except ClientError:
            raise ValueError("corrupt") from None
    except ValueError as disowned:
        assert not cl.is_transient(disowned)
    assert not cl.is_transient(_client_error("NoSuchKey", 404))
    assert not cl.is_transient(_client_error("AccessDenied", 403))
    assert not cl.is_transient(_client_error("NotImplemented", 501))
    assert not cl.is_transient(ValueError("bad"))


def test_retry_policy_retries_transient_errors_only() -> None:
    policy = cl.RetryPolicy(attempts=3, wait_initial_s=0.001, wait_max_s=0.002)
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _client_error("SlowDown", 503)
        return "ok"

    assert policy.wrap(flaky)() == "ok" and len(calls) == 3
    always: list[int] = []

    def down() -> None:
        always.append(1)
        raise _client_error("SlowDown", 503)

    with pytest.raises(ClientError):  # bounded: the last error is re-raised
        policy.wrap(down)()
    assert len(always) == policy.attempts

    fatal: list[int] = []

    def bad() -> None:
        fatal.append(1)
        raise ValueError("not transient")

    with pytest.raises(ValueError):
        policy.wrap(bad)()
    assert fatal == [1]
    assert cl.RetryPolicy().attempts == 4 and cl.MOVER_RETRY.attempts == 5


def test_s3_client_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    c = cl.make_s3_client(retry=cl.RetryPolicy(botocore_attempts=2), max_pool=7)
    assert c.meta.endpoint_url == "http://127.0.0.1:10"  # the S3-specific one wins
    cfg = c.meta.config
    assert cfg.s3 == {"addressing_style": "path"} and cfg.max_pool_connections == 7
    assert (cfg.connect_timeout, cfg.read_timeout) == (5, 60)
    assert cfg.retries == {"mode": "standard", "total_max_attempts": 2}
    assert cl.make_s3_client("http://127.0.0.1:11").meta.endpoint_url == "http://127.0.0.1:11"
    probe = cl.make_probe_client()
    assert (probe.meta.config.connect_timeout, probe.meta.config.read_timeout) == (3, 10)
