"""Compute Broker Python SDK: submit, watch and steer training jobs over gRPC.

Depends only on the generated stubs (``computebroker.v1``), grpcio, pydantic and
tenacity: it imports nothing of the broker server, so it installs and runs anywhere.
``broker.client`` re-exports this package for one release (the old import path).
"""

from brokersdk.client import *  # noqa: F403
from brokersdk.client import __all__  # noqa: F401
