"""The trainer's multipart upload survives a lost CompleteMultipartUpload answer.

Seen in the 200m make-before-break benchmark on a loaded machine: the first Complete
succeeded but its answer came too late, the retry found the upload id gone (moto: 500,
S3: NoSuchUpload), and the final checkpoint failed although every byte was stored. Real
moto S3 server behind the FaultyProxy, which forwards the Complete and then answers 500.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from checkpoint_layout import make_s3_client, new_hasher
from tests.fixtures.faulty_proxy import FaultPlan, FaultyProxy
from trainer.storage import MULTIPART_THRESHOLD, S3Uploader


def test_lost_complete_answer_is_accepted_when_the_object_is_ours(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("lostcomplete")
    data = os.urandom(MULTIPART_THRESHOLD + (5 << 20))
    with FaultyProxy(s3_server.endpoint_url, FaultPlan(lose_completes=1)) as proxy:
        up = S3Uploader(make_s3_client(proxy.endpoint_url), 4)
        up.put(bucket, "ck/__0_1.distcp", [memoryview(data)], new_hasher("xxh3_128"))
        assert proxy.plan.injected == 1, "the Complete's answer was not lost: the test proved nothing"
    got = s3_server.client().get_object(Bucket=bucket, Key="ck/__0_1.distcp")["Body"].read()
    assert got == data


def test_lost_complete_answer_with_someone_elses_object_still_fails(
        s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.apply_env(monkeypatch)
    bucket = s3_server.unique_bucket("lostcomplete")
    data = os.urandom(MULTIPART_THRESHOLD + (5 << 20))

    class Overwriting(FaultPlan):
        def lose(self, method: str, path: str, status: int) -> bool:
            hit = super().lose(method, path, status)
            if hit:  # another writer replaces the object before our retry looks
                s3_server.client().put_object(Bucket=bucket, Key="ck/x", Body=b"x" * len(data))
            return hit

    with FaultyProxy(s3_server.endpoint_url, Overwriting(lose_completes=1)) as proxy:
        up = S3Uploader(make_s3_client(proxy.endpoint_url), 4)
        with pytest.raises(Exception):  # noqa: B017 - whatever the store said, it must not pass
            up.put(bucket, "ck/x", [memoryview(data)], new_hasher("xxh3_128"))
        assert proxy.plan.injected == 1
