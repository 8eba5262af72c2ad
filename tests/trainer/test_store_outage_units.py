"""The trainer's store calls turn an outage into StoreUnavailable (exit 81), wherever it
hits: found by the fault campaign (s3_refused), where a store that went down between the
start-up check and the listing of the attempt's own checkpoints crashed the rank with a
botocore traceback (exit 1, a restart spent) instead."""

from __future__ import annotations

import pytest

from tests.fixtures.stoppable_s3 import StoppableS3
from trainer.checkpoint import find_resume_point
from trainer.errors import StoreUnavailable
from trainer.storage import S3Store


def test_listing_the_latest_checkpoint_during_an_outage(
        stoppable_s3: StoppableS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in stoppable_s3.env.items():
        monkeypatch.setenv(k, v)
    stoppable_s3.client().create_bucket(Bucket="cb-units")
    store = S3Store("s3://cb-units/run")
    store.check_reachable()  # up at the start...
    assert find_resume_point(store, "", 1) is None
    stoppable_s3.down()  # ...down before the attempt lists its own checkpoints
    with pytest.raises(StoreUnavailable, match="unreachable"):
        find_resume_point(store, "", 1)
    with pytest.raises(StoreUnavailable, match="unreachable"):
        find_resume_point(store, "s3://cb-units/run/step-000000004", 1)
