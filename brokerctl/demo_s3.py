"""`brokerctl demo --s3`: a local S3 API server for the demo's checkpoints.

Why moto's server mode: it is a real HTTP S3 endpoint on loopback, so the agents and
trainer ranks use the very code paths they use against AWS S3 (boto3, multipart
uploads, server-side copies between region buckets), with nothing to sign up for.
It runs in the demo's process (a thread) and stops with it. Needs the ``s3demo``
extra (``pip install -e '.[s3demo]'``; ``scripts/demo.sh`` installs it).

What a user sets for a real S3 (docs/operator/fleet.md, "Checkpoints in S3"): ``AWS_ENDPOINT_URL`` only
for a non-AWS endpoint, the usual AWS credentials, and one bucket per region as the
agent's ``checkpoint_bucket: s3://BUCKET[/prefix]``.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any


class S3DemoUnavailable(RuntimeError):
    """moto[server] is not installed."""


@dataclass
class LocalS3:
    """A moto S3 server on a free loopback port, with one bucket per demo region."""

    regions: list[str]
    server: Any = None
    endpoint: str = ""
    buckets: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 30.0) -> None:
        try:
            from moto.server import ThreadedMotoServer
        except ImportError:
            raise S3DemoUnavailable(
                "--s3 needs moto's S3 server: pip install -e '.[s3demo]' "
                "(scripts/demo.sh installs it)") from None
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "demo",
            "AWS_SECRET_ACCESS_KEY": "demo",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
        }
        os.environ.update(self.env)  # the embedded broker and the timeline read it too
        client = self.client()
        deadline = time.monotonic() + timeout
        while True:
            try:
                client.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"local S3 server on {self.endpoint} did not answer") from None
                time.sleep(0.1)
        for region in self.regions:
            bucket = f"cb-demo-{region}"
            client.create_bucket(Bucket=bucket)
            self.buckets[region] = bucket

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="demo",
                            aws_secret_access_key="demo", region_name="us-east-1")

    def objects(self) -> int:
        """How many objects the demo left in its buckets (for the summary)."""
        c = self.client()
        total = 0
        for bucket in self.buckets.values():
            for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                total += len(page.get("Contents", []))
        return total

    def stop(self) -> None:
        if self.server is not None:
            try:
                self.server.stop()
            finally:
                self.server = None
                for k in self.env:
                    os.environ.pop(k, None)
