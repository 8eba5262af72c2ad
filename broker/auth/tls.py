"""Server-side TLS: the two ports' credentials from the config's PEM files.

Why two ports: gRPC Python can either require and verify a client certificate or not
request one at all (no "verify if presented"). So ``listen`` is server-authenticated
TLS for token users, and ``agent_listen`` requires a client certificate signed by
``tls_ca`` (region agents, and users who prefer certificates).
"""

from __future__ import annotations

from pathlib import Path

import grpc

from broker.config import BrokerConfig


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise RuntimeError(f"cannot read {what} {path}: {e.strerror}") from None


def server_credentials(config: BrokerConfig, *, mutual: bool) -> grpc.ServerCredentials:
    key = _read(config.tls_key, "tls_key")
    cert = _read(config.tls_cert, "tls_cert")
    ca = _read(config.tls_ca, "tls_ca")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=mutual)
