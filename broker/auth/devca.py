"""A development certificate authority: CA, broker, agent and user credentials plus a
kubectl-style client config, for the demo and the tests (``brokerctl dev-ca DIR``).

Why EC P-256 and one-year certificates: key generation takes milliseconds (the test
suite makes one CA per session), and nothing here is meant for production, where an
operator's own PKI issues the same names (broker/auth/identity.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.auth.identity import Role, agent_uri, user_uri

_VALID = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Credential:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if private:
        os.chmod(path, 0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


class DevCA:
    """Files under ``root``: ca.pem/ca.key, broker.pem/.key, agents/, users/, config.yaml."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.ca_cert_path = self.root / "ca.pem"
        ca_key_path = self.root / "ca.key"
        if self.ca_cert_path.exists() and ca_key_path.exists():
            self._ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
            self._ca = x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes())
            return
        self._ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "compute-broker dev CA")])
        now = datetime.datetime.now(datetime.UTC)
        self._ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(self._ca_key.public_key()).serial_number(x509.random_serial_number())
                    .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
                    .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                    .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                 False, False), critical=True)
                    .sign(self._ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        _write(ca_key_path, _key_pem(self._ca_key), private=True)  # type: ignore[arg-type]
        _write(self.ca_cert_path, self._ca.public_bytes(serialization.Encoding.PEM))

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert_path.read_bytes()

    def _issue(self, stem: Path, cn: str, sans: list[x509.GeneralName], server: bool) -> Credential:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
                .issuer_name(self._ca.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + _VALID)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .sign(self._ca_key, hashes.SHA256()))  # type: ignore[arg-type]
        return Credential(_write(stem.with_suffix(".pem"), cert.public_bytes(serialization.Encoding.PEM)),
                          _write(stem.with_suffix(".key"), _key_pem(key), private=True))

    def write_crl(self, path: Path, serials: list[int]) -> Path:
        """A PEM CRL signed by this CA revoking ``serials`` (the broker's ``tls_crl``)."""
        now = datetime.datetime.now(datetime.UTC)
        b = (x509.CertificateRevocationListBuilder().issuer_name(self._ca.subject)
             .last_update(now - datetime.timedelta(minutes=5)).next_update(now + _VALID))
        for serial in serials:
            b = b.add_revoked_certificate(x509.RevokedCertificateBuilder().serial_number(serial)
                                          .revocation_date(now).build())
        crl = b.sign(self._ca_key, hashes.SHA256())  # type: ignore[arg-type]
        return _write(Path(path), crl.public_bytes(serialization.Encoding.PEM))

    def broker(self, hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")) -> Credential:
        sans: list[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        return self._issue(self.root / "broker", "compute-broker", sans, server=True)

    def agent(self, region: str, agent_id: str) -> Credential:
        return self._issue(self.root / "agents" / agent_id, agent_id,
                           [x509.UniformResourceIdentifier(agent_uri(region, agent_id))], server=False)

    def user(self, name: str, role: Role, team: str = "") -> Credential:
        return self._issue(self.root / "users" / name, name,
                           [x509.UniformResourceIdentifier(user_uri(name, role, team))], server=False)


def write_client_config(path: Path, contexts: dict[str, dict[str, str]], current: str) -> Path:
    """A kubectl-style client config (brokersdk/credentials.py reads it)."""
    data = {"current-context": current,
            "contexts": [{"name": n, **c} for n, c in contexts.items()]}
    return _write(Path(path), yaml.safe_dump(data, sort_keys=False).encode(), private=True)


DEFAULT_AGENTS = [("us-east-1", "us-east-1-agent"), ("us-west-2", "us-west-2-agent"),
                  ("eu-west-1", "eu-west-1-agent")]
DEFAULT_USERS = [("admin", Role.OPERATOR, ""), ("alice", Role.MEMBER, "ml"),
                 ("carol", Role.TEAM_ADMIN, "ml")]


@dataclass
class DevPKI:
    """What :func:`create_dev_pki` made."""

    ca: DevCA
    broker: Credential
    tokens: dict[str, str]  # user -> bearer token
    client_config: Path
    broker_settings: dict[str, str]  # BrokerConfig fields naming the files


def create_dev_pki(root: Path, *, server: str = "127.0.0.1:50051",
                   mtls_server: str = "127.0.0.1:50052",
                   agents: list[tuple[str, str]] | None = None,
                   users: list[tuple[str, Role, str]] | None = None) -> DevPKI:
    """CA, broker certificate, agent certificates (region, agent id), and for each user
    (name, role, team) a bootstrap token (``tokens.yaml``, the broker's
    ``static_tokens_file``) and a certificate. ``config.yaml`` gets two contexts per
    user: ``<name>`` (token, on ``server``) and ``<name>-cert`` (certificate, on the
    mutual-TLS ``mtls_server``); the first user's token context is current.
    ``broker.yaml`` holds the broker settings (``brokerctl serve --config``)."""
    root = Path(root).resolve()  # absolute paths in broker.yaml and config.yaml
    ca = DevCA(root)
    broker = ca.broker()
    for region, agent_id in DEFAULT_AGENTS if agents is None else agents:
        ca.agent(region, agent_id)
    users = DEFAULT_USERS if users is None else users
    tokens = write_static_tokens(root / "tokens.yaml", users)
    contexts: dict[str, dict[str, str]] = {}
    for name, role, team in users:
        cred = ca.user(name, role, team)
        contexts[name] = {"server": server, "ca": str(ca.ca_cert_path), "token": tokens[name]}
        contexts[f"{name}-cert"] = {"server": mtls_server, "ca": str(ca.ca_cert_path),
                                    "client-cert": str(cred.cert), "client-key": str(cred.key)}
    cfg = write_client_config(root / "config.yaml", contexts, users[0][0] if users else "")
    settings = {"tls_cert": str(broker.cert), "tls_key": str(broker.key),
                "tls_ca": str(ca.ca_cert_path), "static_tokens_file": str(root / "tokens.yaml")}
    _write(root / "broker.yaml", yaml.safe_dump(settings, sort_keys=False).encode())
    return DevPKI(ca, broker, tokens, cfg, settings)


def write_static_tokens(path: Path, users: list[tuple[str, Role, str]]) -> dict[str, str]:
    """Bootstrap tokens for ``users`` (name, role, team): the hashes go to ``path`` (the
    broker's ``static_tokens_file``); returns name -> bearer token (shown once)."""
    from broker.auth.tokens import hash_secret, new_token

    entries, out = [], {}
    for name, role, team in users:
        tid, secret, token = new_token()
        entries.append({"id": tid, "user": name, "role": role.value, "team": team,
                        "hash": hash_secret(secret)})
        out[name] = token
    _write(Path(path), yaml.safe_dump({"tokens": entries}, sort_keys=False).encode(), private=True)
    return out
