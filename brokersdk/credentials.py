"""Where a client's credentials come from, kubectl-style, and the channel they make.

Order (first wins per field): explicit arguments, environment (``CB_SERVER``,
``CB_TOKEN``, ``CB_CA``, ``CB_CLIENT_CERT``, ``CB_CLIENT_KEY``, ``CB_CONTEXT``,
``CB_INSECURE=1`` for an insecure dev broker), then the current context of the config
file (``CB_CONFIG`` or ``~/.config/compute-broker/config.yaml``, written by ``brokerctl
dev-ca``). A context holds ``server``, ``ca`` and either ``token`` or
``client-cert``/``client-key`` (certificates go to the broker's mutual-TLS port).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import grpc

DEFAULT_CONFIG = Path("~/.config/compute-broker/config.yaml")


class CredentialsError(ValueError):
    """A config file or credential that cannot be used (one line, says what to fix)."""


@dataclass(frozen=True)
class ClientCredentials:
    server: str = ""
    ca: str = ""  # path to the CA bundle that signed the broker's certificate
    token: str = ""
    client_cert: str = ""
    client_key: str = ""
    insecure: bool = False  # plaintext, for a broker started with --insecure-dev only
    context: str = ""
    token_from_env: bool = False  # CB_TOKEN (or an argument) gave the token, not a context

    @property
    def has_identity(self) -> bool:
        return self.insecure or bool(self.token) or bool(self.client_cert)


def config_path() -> Path:
    return Path(os.environ.get("CB_CONFIG") or DEFAULT_CONFIG).expanduser()


def config_source() -> tuple[str, bool]:
    """How the config file was chosen, for messages (``CB_CONFIG=PATH`` or the default
    path), and whether it exists: a forgotten ``export CB_CONFIG`` must be visible."""
    path = config_path()
    named = f"CB_CONFIG={os.environ['CB_CONFIG']}" if os.environ.get("CB_CONFIG") else str(DEFAULT_CONFIG)
    return named, path.exists()


def _load_context(name: str) -> ClientCredentials:
    path = config_path()
    if not path.exists():
        if name:
            raise CredentialsError(f"context {name!r} asked for, but {path} does not exist")
        return ClientCredentials()
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise CredentialsError(f"cannot read client config {path}: {e}") from None
    if not isinstance(data, dict):
        raise CredentialsError(f"client config {path} must be a mapping")
    want = name or str(data.get("current-context") or "")
    contexts = {str(c.get("name")): c for c in data.get("contexts") or [] if isinstance(c, dict)}
    if not want:
        return ClientCredentials()
    c = contexts.get(want)
    if c is None:
        raise CredentialsError(f"context {want!r} is not in {path} (has: {', '.join(contexts) or 'none'})")
    return ClientCredentials(server=str(c.get("server") or ""), ca=str(c.get("ca") or ""),
                             token=str(c.get("token") or ""),
                             client_cert=str(c.get("client-cert") or ""),
                             client_key=str(c.get("client-key") or ""),
                             insecure=bool(c.get("insecure")), context=want)


def resolve(server: str = "", context: str = "", token: str = "", ca: str = "",
            insecure: bool | None = None) -> ClientCredentials:
    """The credentials to use: arguments, then CB_* environment, then the config file."""
    env = os.environ
    base = _load_context(context or env.get("CB_CONTEXT", ""))
    over: dict[str, Any] = {}
    for field, arg, var in (("server", server, "CB_SERVER"), ("token", token, "CB_TOKEN"),
                            ("ca", ca, "CB_CA"), ("client_cert", "", "CB_CLIENT_CERT"),
                            ("client_key", "", "CB_CLIENT_KEY")):
        value = arg or env.get(var, "")
        if value:
            over[field] = value
    if "token" in over:  # a token given outright replaces the context's certificate
        over["token_from_env"] = True
        over.setdefault("client_cert", "")
        over.setdefault("client_key", "")
    if insecure is not None:
        over["insecure"] = insecure
    elif env.get("CB_INSECURE", "") in ("1", "true", "yes"):
        over["insecure"] = True
    return replace(base, **over)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as e:
        raise CredentialsError(f"cannot read {what} {path}: {e.strerror}") from None


def channel_credentials(creds: ClientCredentials) -> grpc.ChannelCredentials:
    """TLS (the broker verified against ``ca``) + the client certificate, if any. The
    token is added by :class:`_BearerToken` (see there why not call credentials)."""
    root = _read(creds.ca, "CA file (CB_CA / context ca)") if creds.ca else None
    key = cert = None
    if creds.client_cert:
        cert = _read(creds.client_cert, "client certificate")
        key = _read(creds.client_key or creds.client_cert, "client key")
    return grpc.ssl_channel_credentials(root_certificates=root, private_key=key, certificate_chain=cert)


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call. Why not
    ``grpc.access_token_call_credentials``: that runs a Python plugin on another thread
    for every call, which costs small RPCs a measurable share of their throughput."""

    def __init__(self, token: str) -> None:
        self._pair = ("authorization", f"Bearer {token}")

    def _with_token(self, d: Any) -> _Details:
        return _Details(d.method, d.timeout, [*(d.metadata or ()), self._pair], d.credentials,
                        getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._with_token(details), requests)


def make_channel(address: str, creds: ClientCredentials,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
    """A channel to ``address``: plaintext only for ``insecure`` (a dev broker), else TLS
    with the client certificate and/or the bearer token."""
    if creds.insecure:
        return grpc.insecure_channel(address, options=list(options))
    channel = grpc.secure_channel(address, channel_credentials(creds), options=list(options))
    if creds.token:
        return grpc.intercept_channel(channel, _BearerToken(creds.token))
    return channel
