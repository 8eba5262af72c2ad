"""What the HA tests share: the short lease, a leadership probe, a started replica pair."""

from __future__ import annotations

import grpc

from computebroker.v1 import capacity_pb2, capacity_pb2_grpc
from tests.fixtures.cluster import Cluster, free_port
from tests.fixtures.pki import session_pki

LEASE_S = 3.0  # short lease so a takeover happens quickly; tests never assert on time


def probe(address: str) -> tuple[bool, str]:
    """(True, "") if ``address`` serves the API, else (False, the UNAVAILABLE details)."""
    with session_pki().channel(address) as channel:  # TLS, as the bootstrap operator
        stub = capacity_pb2_grpc.CapacityServiceStub(channel)
        try:
            stub.ListRegions(capacity_pb2.ListRegionsRequest(), timeout=5)
            return True, ""
        except grpc.RpcError as e:
            assert e.code() is grpc.StatusCode.UNAVAILABLE, f"{e.code()}: {e.details()}"
            return False, e.details() or ""


def start_pair(c: Cluster, ids: str = "ha") -> tuple[str, str]:
    """Broker a (started first, so it leads) and standby b, with broker ids ``<ids>-a`` and
    ``<ids>-b``; returns their addresses."""
    c.start_broker("--set", f"broker_id={ids}-a")
    port_b = free_port()
    c.start_replica("b", port_b, "--set", f"broker_id={ids}-b")
    return c.address, f"127.0.0.1:{port_b}"
