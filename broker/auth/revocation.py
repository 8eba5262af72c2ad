"""Client certificates that are no longer trusted: a CRL and/or a deny list, re-read
when their files change.

Why both: a CRL (``tls_crl``, PEM, signed by ``tls_ca``) is what a real CA publishes;
a deny list (``cert_deny_list``: one serial, ``0x``-hex or decimal, or one SHA-256
fingerprint of the certificate's DER, 64 hex digits with or without colons, per line;
``#`` starts a comment) is what an operator can write in a minute when an agent host
is lost. Why here and not in the TLS layer: gRPC Python's server credentials cannot be
given a CRL, and changing them means a restart; the auth layer sees the verified peer
certificate of every call (``x509_pem_cert``) and asks :meth:`CertRevocations.refusal`.

Reloading: the files' (mtime, size) are looked at no more often than every
``check_every_s`` seconds, by whichever call comes first; a changed file is parsed
again. A file that no longer parses (or a CRL with a bad signature) keeps the previous
list in force and logs an error: a typo must not un-revoke anyone. A missing file at
start is an error (the broker refuses to start); removed later, it counts as empty.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

log = logging.getLogger(__name__)

_FINGERPRINT = re.compile(r"^(?:[0-9a-f]{2}:?){31}[0-9a-f]{2}$")


@dataclass(frozen=True)
class Revoked:
    """What is refused: certificate serial numbers and SHA-256 fingerprints (hex)."""

    serials: frozenset[int] = frozenset()
    fingerprints: frozenset[str] = frozenset()


def parse_deny_list(text: str) -> Revoked:
    """Serials and fingerprints of a deny-list file; ValueError names a bad line."""
    serials: set[int] = set()
    prints: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip().lower()
        if not line:
            continue
        if _FINGERPRINT.match(line):
            prints.add(line.replace(":", ""))
            continue
        try:
            serials.add(int(line, 16) if line.startswith("0x") else int(line))
        except ValueError:
            raise ValueError(f"line {n}: {raw.strip()!r} is neither a serial (decimal or 0x-hex)"
                             " nor a SHA-256 fingerprint (64 hex digits)") from None
    return Revoked(frozenset(serials), frozenset(prints))


def parse_crl(pem: bytes, ca_pem: bytes) -> Revoked:
    """The serials of a PEM CRL; ValueError unless ``ca_pem``'s key signed it."""
    crl = x509.load_pem_x509_crl(pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
        raise ValueError("the CRL is not signed by the broker's CA (tls_ca)")
    return Revoked(frozenset(r.serial_number for r in crl))


@lru_cache(maxsize=4096)
def cert_ids(cert_pem: bytes) -> tuple[int, str]:
    """(serial, SHA-256 fingerprint hex) of a PEM certificate; cached: every call of a
    connection presents the same certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return cert.serial_number, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class _Watched:
    """One file, its last (mtime, size) and what it said."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.stamp: tuple[int, int] | None = None
        self.revoked = Revoked()


class CertRevocations:
    """The broker's revoked client certificates (see the module docstring)."""

    def __init__(self, crl: str = "", deny_list: str = "", ca: str = "",
                 check_every_s: float = 2.0) -> None:
        self._ca = ca
        self._crl = _Watched(crl) if crl else None
        self._deny = _Watched(deny_list) if deny_list else None
        self.check_every_s = check_every_s
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._revoked = Revoked()
        for w in self._files():
            if not Path(w.path).is_file():
                raise RuntimeError(f"{w.path}: no such file (tls_crl / cert_deny_list)")
        self.reload(strict=True)

    @property
    def enabled(self) -> bool:
        return self._crl is not None or self._deny is not None

    def _files(self) -> list[_Watched]:
        return [w for w in (self._crl, self._deny) if w is not None]

    def reload(self, strict: bool = False) -> None:
        """Re-read every changed file now. ``strict``: a bad file raises (at start)."""
        with self._lock:
            for w in self._files():
                try:
                    st = os.stat(w.path)
                    stamp = (st.st_mtime_ns, st.st_size)
                except FileNotFoundError:
                    stamp = (0, 0)
                if stamp == w.stamp:
                    continue
                try:
                    if stamp == (0, 0):
                        new = Revoked()
                    elif w is self._crl:
                        new = parse_crl(Path(w.path).read_bytes(), Path(self._ca).read_bytes())
                    else:
                        new = parse_deny_list(Path(w.path).read_text())
                except (OSError, ValueError) as e:
                    if strict:
                        raise RuntimeError(f"{w.path}: {e}") from None
                    log.error("%s: %s; the previous revocation list stays in force", w.path, e)
                    continue
                w.stamp, w.revoked = stamp, new
                log.info("%s: %d revoked serials, %d fingerprints", w.path,
                         len(new.serials), len(new.fingerprints))
            files = self._files()
            self._revoked = Revoked(frozenset().union(*(w.revoked.serials for w in files)),
                                    frozenset().union(*(w.revoked.fingerprints for w in files)))
            self._next_check = time.monotonic() + self.check_every_s

    def _current(self) -> Revoked:
        if time.monotonic() >= self._next_check:
            self.reload()
        return self._revoked

    def refusal(self, cert_pem: bytes) -> str:
        """Why the certificate ``cert_pem`` is refused ("" = not revoked)."""
        if not self.enabled or not cert_pem:
            return ""
        revoked = self._current()
        serial, fingerprint = cert_ids(cert_pem)
        if serial in revoked.serials:
            return f"the client certificate (serial {serial:#x}) is revoked"
        if fingerprint in revoked.fingerprints:
            return f"the client certificate (SHA-256 {fingerprint[:16]}...) is revoked"
        return ""
