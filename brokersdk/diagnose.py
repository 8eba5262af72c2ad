"""Why a broker call failed, said in terms of what the user set (not what gRPC saw).

gRPC reports every connection-level mistake as UNAVAILABLE with a transport detail:
a broker that is up but spoken to in plaintext, a token user on the agents' mutual-TLS
port, a missing CA and a broker that is really down all read "cannot reach". When a
call fails that way, :func:`diagnose` looks at the address once more with the standard
library (a TCP connect, then a TLS handshake) and at the credentials' sources, and
returns the one error that names the variable to change. It runs only after a failure,
so a healthy call pays nothing.

The rules are data (:data:`_FINDINGS`): the probe's :class:`Finding` picks the message.
"""

from __future__ import annotations

import enum
import socket
import ssl
from pathlib import Path

import grpc

from brokersdk.credentials import DEFAULT_CONFIG, ClientCredentials, config_source
from brokersdk.errors import BrokerError, BrokerUnavailable, NotAuthenticated

PROBE_TIMEOUT_S = 2.0
# The HTTP/2 client preface and an empty SETTINGS frame: enough for a gRPC server to
# answer (or, on a mutual-TLS port under TLS 1.3, to send "certificate required").
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class Finding(enum.Enum):
    """What the probe saw at the address."""

    DOWN = "down"  # nothing accepts a TCP connection
    PLAINTEXT = "plaintext"  # a server that does not speak TLS (an --insecure-dev broker)
    TLS = "tls"  # a TLS server that does not ask for a client certificate
    MUTUAL_TLS = "mutual-tls"  # a TLS server that requires a client certificate
    UNKNOWN = "unknown"


def _split(address: str) -> tuple[str, int] | None:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> Finding:
    """What listens at ``address``: nothing, plaintext, TLS or mutual TLS.

    Why the standard library and not gRPC: a gRPC channel hides the difference behind
    UNAVAILABLE; a raw handshake shows it (a plaintext server answers a ClientHello with
    bytes that are not TLS; a mutual-TLS server asks for a certificate).
    """
    target = _split(address)
    if target is None:
        return Finding.UNKNOWN
    try:
        raw = socket.create_connection(target, timeout=timeout)
    except OSError:
        return Finding.DOWN
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only *whether* it speaks TLS; trust is gRPC's job
    ctx.set_alpn_protocols(["h2"])
    try:
        with raw, ctx.wrap_socket(raw, server_hostname=target[0]) as tls:
            tls.settimeout(timeout)
            try:
                tls.sendall(_H2_PREFACE)
                answer = tls.recv(1)
            except ssl.SSLError as e:
                return Finding.MUTUAL_TLS if _asks_certificate(e) else Finding.TLS
            except (TimeoutError, OSError):
                return Finding.TLS
            # A gRPC server answers the preface with its SETTINGS; one that wanted a
            # client certificate (TLS 1.3 asks after the handshake) just hangs up.
            return Finding.TLS if answer else Finding.MUTUAL_TLS
    except ssl.SSLError as e:
        if _asks_certificate(e):  # TLS 1.2: refused inside the handshake
            return Finding.MUTUAL_TLS
        text = str(e).lower()
        if "wrong version" in text or "record layer" in text or "unknown protocol" in text:
            return Finding.PLAINTEXT
        return Finding.UNKNOWN
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        return Finding.PLAINTEXT  # closed on a ClientHello it could not parse
    except OSError as e:
        if "EOF" in str(e):
            return Finding.PLAINTEXT
        return Finding.UNKNOWN


def _asks_certificate(e: ssl.SSLError) -> bool:
    text = f"{e.reason} {e}".lower()
    return "certificate_required" in text or "certificate required" in text or (
        "handshake_failure" in text and "alert" in text)


def config_note(creds: ClientCredentials) -> str:
    """Where credentials came from, or why none were found: one clause for a message."""
    source, exists = config_source()
    if creds.context:
        return f"context {creds.context!r} of {source}"
    if source.startswith("CB_CONFIG") and not exists:
        return f"{source} does not exist"
    if not exists:
        return f"no client config (CB_CONFIG is unset and {DEFAULT_CONFIG} does not exist)"
    return f"{source} has no current context"


_SETUP_HINT = ("export CB_CONFIG=DIR/config.yaml (written by `brokerctl dev-ca DIR`), or set"
               " CB_SERVER, CB_CA and CB_TOKEN")


def diagnose(err: BrokerError, address: str, creds: ClientCredentials) -> BrokerError:
    """The error to show for ``err``: the same one unless a probe or the credentials'
    sources explain it better (always a :class:`BrokerError`, one message, one hint)."""
    if isinstance(err, NotAuthenticated):
        return _not_authenticated(err, creds)
    if not isinstance(err, BrokerUnavailable) or err.code is not grpc.StatusCode.UNAVAILABLE:
        return err
    raw = (err.details or "").lower()
    if "state store unavailable" in raw or "no longer leads" in raw or "standby" in raw:
        return err  # the broker answered: errors.py already says what it said
    first = address.split(",")[0].strip()
    finding = probe(first)
    fix = _FINDINGS.get((finding, creds.insecure, bool(creds.client_cert)))
    if fix is not None:
        message, hint = fix
        return BrokerUnavailable(message.format(address=first), err.code,
                                 hint=hint.format(address=first))
    if finding is Finding.TLS and not creds.insecure:
        return _tls_trust(err, first, creds)
    if finding is Finding.DOWN:
        return BrokerUnavailable(
            f"cannot reach the broker at {first}: nothing is listening there", err.code,
            hint="is it running? start one with `brokerctl serve`, or point CB_SERVER (or"
            " --broker) at it" + _where(creds))
    return err


def _where(creds: ClientCredentials) -> str:
    return "" if creds.server or creds.context else f"; {config_note(creds)}"


# (what is there, client plaintext?, client has a certificate?) -> (message, hint)
_FINDINGS: dict[tuple[Finding, bool, bool], tuple[str, str]] = {
    (Finding.TLS, True, False): (
        "the broker at {address} is up and speaks TLS, but this client uses plaintext"
        " (CB_INSECURE=1 or the context's insecure: true)",
        "unset CB_INSECURE (it is for a broker started with --insecure-dev only) and set"
        " CB_CA and CB_TOKEN, or use a context from `brokerctl dev-ca`"),
    (Finding.MUTUAL_TLS, True, False): (
        "{address} is the broker's mutual-TLS port (agents and certificate users), and"
        " this client uses plaintext (CB_INSECURE=1)",
        "set CB_SERVER (or --broker) to the broker's listen address, unset CB_INSECURE,"
        " and set CB_CA and CB_TOKEN"),
    (Finding.MUTUAL_TLS, False, False): (
        "{address} is the broker's mutual-TLS port (agents and certificate users): it"
        " asks for a client certificate, and a token user has none",
        "set CB_SERVER (or --broker) to the broker's listen address (`serve --listen`,"
        " default port 50051); the agent port is for agents"),
    (Finding.PLAINTEXT, False, False): (
        "the broker at {address} is up but speaks plaintext (started with --insecure-dev),"
        " and this client uses TLS",
        "for a dev broker set CB_INSECURE=1; otherwise CB_SERVER names the wrong address"),
    (Finding.PLAINTEXT, False, True): (
        "the broker at {address} is up but speaks plaintext (started with --insecure-dev),"
        " and this client uses TLS with a certificate",
        "for a dev broker set CB_INSECURE=1; otherwise CB_SERVER names the wrong address"),
}


def _tls_trust(err: BrokerError, address: str, creds: ClientCredentials) -> BrokerError:
    """A TLS server is there and the handshake still failed: the CA does not fit."""
    if not creds.ca:
        return BrokerUnavailable(
            f"the broker at {address} is up, but its certificate cannot be verified: no CA"
            f" is set (CB_CA is unset; {config_note(creds)})", err.code, hint=_SETUP_HINT)
    if not Path(creds.ca).expanduser().is_file():
        return BrokerUnavailable(f"the CA file {creds.ca} (CB_CA / the context's ca) does not"
                                 " exist", err.code, hint=_SETUP_HINT)
    if creds.client_cert:
        return BrokerUnavailable(
            f"TLS with the broker at {address} failed: the CA in {creds.ca} did not sign its"
            " certificate, or the broker refused the client certificate", err.code,
            hint="check CB_CA / the context's ca and CB_CLIENT_CERT (certificates go to the"
            " broker's mutual-TLS port, agent_listen)")
    return BrokerUnavailable(
        f"the broker at {address} is up, but its certificate is not signed by the CA in"
        f" {creds.ca}", err.code,
        hint="CB_CA (or the context's ca) must be the CA that signed the broker's"
        " certificate (the ca.pem next to the config `brokerctl dev-ca` wrote)")


def _not_authenticated(err: BrokerError, creds: ClientCredentials) -> BrokerError:
    """One coherent message: a refused token is not the same as no token at all."""
    if creds.token:
        origin = "CB_TOKEN" if creds.token_from_env else (
            f"the token of context {creds.context!r}" if creds.context else "the token")
        return NotAuthenticated(f"the broker refused {origin}: {err.message}", err.code,
                                hint="CB_TOKEN, when set, wins over the context's token; an"
                                " operator issues tokens with `brokerctl users create`")
    if creds.client_cert:
        return NotAuthenticated(f"the broker refused the client certificate: {err.message}",
                                err.code, hint="certificates go to the broker's mutual-TLS"
                                " port (agent_listen); check CB_CLIENT_CERT")
    return NotAuthenticated(
        f"not logged in: CB_TOKEN is unset and {config_note(creds)}", err.code,
        hint=_SETUP_HINT)
