"""Users' bearer tokens: ``cbt_<id>_<secret>``, stored as argon2id hashes in the store.

Why this shape: the id part makes verification one keyed lookup (never a scan of all
hashes); argon2id makes a stolen store useless for minting tokens; and because argon2
costs tens of milliseconds by design, a successful verification is cached in memory
keyed by the SHA-256 of the whole token, so only a token's first use per broker pays
it (each cache TTL the entry is renewed by re-reading the token's record, not by
hashing again: :meth:`TokenManager.verify`).

Revocation and rotation: the new record (revoked, or the new hash) is stored FIRST,
then this replica's cache entries of the token are dropped and its generation bumped;
a verification that was in flight across the change (it read the old record) sees the
generation moved and does not cache what it read. Storing first and invalidating
second is not enough on its own: the in-flight check would re-cache the old secret
after the drop (a rotated secret then kept working for the cache TTL). Other replicas
of an HA pair drop nothing: their cache entries live at most ``cache_ttl_s``, which the
broker sets to one leader lease interval, so a revocation is seen everywhere within it.

Expiry: every token created through the API has an ``expires_time`` (the broker's
``token_default_ttl_s`` unless ``--ttl`` asks for less, at most ``token_max_ttl_s``);
an expired token is refused with a message saying when it expired.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import secrets
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from broker.auth.identity import NAME_RE, CredentialKind, Principal, Role
from broker.store.base import Store
from computebroker.v1 import auth_pb2 as apb

if TYPE_CHECKING:
    from broker.config import BrokerConfig

KIND_TOKEN = "token"  # store record kind: ApiToken, key = token id
TOKEN_RE = re.compile(r"^cbt_(?P<id>[0-9a-f]{12})_(?P<secret>[A-Za-z0-9_-]{20,100})$")
CACHE_TTL_S = 10.0  # default only; the broker passes its leader lease interval
# Moderate argon2id cost: tokens are long random secrets (not passwords), so the hash
# only has to make offline guessing pointless; a verification takes a few ms.
_HASHER = PasswordHasher(time_cost=2, memory_cost=19 * 1024, parallelism=1)


class TokenError(ValueError):
    """A bad or unknown token (the caller sees UNAUTHENTICATED)."""


def hash_secret(secret: str) -> str:
    return _HASHER.hash(secret)


def new_token() -> tuple[str, str, str]:
    """(token id, secret, full bearer token) of a fresh token."""
    tid, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
    return tid, secret, f"cbt_{tid}_{secret}"


def load_static_tokens(path: str) -> dict[str, apb.ApiToken]:
    """The bootstrap tokens file (``static_tokens_file``): token id -> ApiToken."""
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise RuntimeError(f"cannot read static_tokens_file {path}: {e}") from None
    out: dict[str, apb.ApiToken] = {}
    for i, t in enumerate(data.get("tokens") or []):
        try:
            role = Role.parse(str(t["role"]))
            out[str(t["id"])] = apb.ApiToken(id=str(t["id"]), user=str(t["user"]),
                                             team=str(t.get("team") or ""), role=role.value,
                                             secret_hash=str(t["hash"]), created_by="static")
        except (KeyError, TypeError, ValueError) as e:
            raise RuntimeError(f"static_tokens_file {path}: entry {i} is invalid ({e})") from None
    return out


DEFAULT_TTL_S = 90 * 86_400.0  # a token nobody renews stops working within a quarter
MAX_TTL_S = 366 * 86_400.0


def when(t: float) -> str:
    """A Unix time as UTC ISO 8601 to the second (refusal messages, listings)."""
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class TokenManager:
    """Creates, verifies, revokes and rotates tokens; see the module docstring."""

    def __init__(self, store: Store, static: dict[str, apb.ApiToken] | None = None, *,
                 cache_ttl_s: float = CACHE_TTL_S, default_ttl_s: float = DEFAULT_TTL_S,
                 max_ttl_s: float = MAX_TTL_S) -> None:
        self.store = store
        self.static = dict(static or {})
        self.cache_ttl_s = cache_ttl_s
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self._lock = threading.Lock()
        # sha256(token) -> (monotonic cache expiry, wall-clock token expiry or 0, principal,
        # the stored hash it was verified against)
        self._cache: dict[bytes, tuple[float, float, Principal, str]] = {}
        # token id -> bumped on every revoke/rotate here (see the module docstring)
        self._generation: dict[str, int] = {}

    @classmethod
    def for_config(cls, store: Store, config: BrokerConfig) -> TokenManager:
        """The broker's manager: static tokens from its file, cache entries living one
        leader lease interval (a revocation on one replica is seen on all within it),
        token lifetimes from its settings."""
        return cls(store, load_static_tokens(config.static_tokens_file),
                   cache_ttl_s=config.leader_lease_s, default_ttl_s=config.token_default_ttl_s,
                   max_ttl_s=config.token_max_ttl_s)

    # ---- operators ------------------------------------------------------------------
    def create(self, user: str, team: str, role: Role, created_by: str,
               ttl_s: float = 0.0) -> apb.IssuedToken:
        """A new token; ``ttl_s`` 0 = the default lifetime."""
        if not NAME_RE.match(user):
            raise ValueError(f"user {user!r}: use letters, digits, '.', '_' or '-' (max 128)")
        if role is Role.AGENT:
            raise ValueError("agents authenticate with certificates, not tokens")
        if role is not Role.OPERATOR and not NAME_RE.match(team):
            raise ValueError(f"a {role.value} needs a team (got {team!r})")
        if ttl_s < 0 or ttl_s != ttl_s:
            raise ValueError(f"ttl {ttl_s!r}: give a positive lifetime (or 0 for the default)")
        if ttl_s > self.max_ttl_s:
            raise ValueError(f"ttl {ttl_s:.0f}s is longer than this broker allows"
                             f" (token_max_ttl_s={self.max_ttl_s:.0f}s)")
        now = time.time()
        tok = apb.ApiToken(id=secrets.token_hex(6), user=user,
                           team="" if role is Role.OPERATOR else team, role=role.value,
                           created_time=now, created_by=created_by,
                           expires_time=now + (ttl_s or self.default_ttl_s))
        return self._issue(tok)

    def _issue(self, tok: apb.ApiToken) -> apb.IssuedToken:
        secret = secrets.token_urlsafe(32)
        tok.secret_hash = hash_secret(secret)
        self.store.put_record(KIND_TOKEN, tok.id, tok)
        return apb.IssuedToken(token=_public(tok), secret=f"cbt_{tok.id}_{secret}")

    def get(self, token_id: str) -> apb.ApiToken:
        if token_id in self.static:
            raise ValueError(f"token {token_id} is a static bootstrap token: remove it from"
                             " static_tokens_file and restart the broker")
        tok = self.store.get_record(KIND_TOKEN, token_id, apb.ApiToken)
        if tok is None:
            raise KeyError(token_id)
        return tok  # type: ignore[return-value]

    def list(self, user: str = "", include_revoked: bool = False) -> list[apb.ApiToken]:
        toks = self.store.list_records(KIND_TOKEN, apb.ApiToken)
        return [_public(t) for t in toks  # type: ignore[arg-type]
                if (not user or t.user == user) and (include_revoked or not t.revoked)]

    def revoke(self, token_id: str) -> apb.ApiToken:
        tok = self.get(token_id)
        tok.revoked, tok.revoked_time = True, time.time()
        self.store.put_record(KIND_TOKEN, tok.id, tok)  # stored first, then forgotten
        self._forget(token_id)
        return _public(tok)

    def rotate(self, token_id: str) -> apb.IssuedToken:
        """A new secret for the same token id (same expiry); the old secret stops
        working at once on this replica, within ``cache_ttl_s`` on the others."""
        tok = self.get(token_id)
        if tok.revoked:
            raise ValueError(f"token {token_id} is revoked; create a new one")
        if tok.expires_time and tok.expires_time <= time.time():
            raise ValueError(f"token {token_id} expired at {when(tok.expires_time)}; create a new one")
        tok.rotated_time = time.time()
        issued = self._issue(tok)  # the new hash is stored first ...
        self._forget(token_id)  # ... then the old secret's cache entries go
        return issued

    # ---- every RPC --------------------------------------------------------------------
    def cached(self, token: str) -> Principal | None:
        """The token's principal if a verification younger than ``cache_ttl_s`` holds it
        (an expired token still raises TokenError), else None: no store read, no argon2,
        so a caller on an event loop may ask it and hand only a miss to a thread."""
        hit = self._cache.get(hashlib.sha256(token.encode()).digest())  # a dict read: atomic
        if hit is None or hit[0] <= time.monotonic():
            return None
        _refuse_expired(hit[2].token_id, hit[1])
        return hit[2]

    def verify(self, token: str) -> Principal:
        """The token's principal. A cached verification younger than ``cache_ttl_s`` is
        the answer; an older one re-reads the token's record (revoked? expired?) and, if
        the stored hash is the very one this token was checked against, is renewed
        without argon2: the secret it verified cannot have changed under the same hash.
        Why: argon2 costs tens of ms by design, and every TTL all concurrent callers of
        a token missed at once (16 clients: 16 hashes every 10 s, a visible share of
        the broker's CPU and its p99 under a submit storm). A rotated secret has a new
        hash and is verified in full."""
        key = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            _refuse_expired(hit[2].token_id, hit[1])
            return hit[2]
        m = TOKEN_RE.match(token)
        if not m:
            raise TokenError("malformed token (expected cbt_<id>_<secret>)")
        with self._lock:
            generation = self._generation.get(m["id"], 0)
        tok = self.static.get(m["id"]) or self.store.get_record(KIND_TOKEN, m["id"], apb.ApiToken)
        if tok is None or tok.revoked:  # type: ignore[union-attr]
            raise TokenError(f"token {m['id']} is unknown or revoked")
        expires = float(tok.expires_time)  # type: ignore[union-attr]
        _refuse_expired(m["id"], expires)
        secret_hash = tok.secret_hash  # type: ignore[union-attr]
        if hit is None or hit[3] != secret_hash or hit[2].token_id != m["id"]:
            try:
                _HASHER.verify(secret_hash, m["secret"])
            except (VerificationError, InvalidHashError):
                raise TokenError(f"token {m['id']}: wrong secret (rotated?)") from None
        principal = Principal(tok.user, Role.parse(tok.role), team=tok.team,  # type: ignore[union-attr]
                              credential=CredentialKind.TOKEN, token_id=tok.id)  # type: ignore[union-attr]
        with self._lock:
            # Revoked or rotated here while this check ran: what it read may be the old
            # record; answer this one call, but never cache it.
            if self._generation.get(m["id"], 0) == generation:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[key] = (now + self.cache_ttl_s, expires, principal, secret_hash)
        return principal

    def _forget(self, token_id: str) -> None:
        with self._lock:
            self._generation[token_id] = self._generation.get(token_id, 0) + 1
            for k in [k for k, (_, _, p, _) in self._cache.items() if p.token_id == token_id]:
                del self._cache[k]


def _refuse_expired(token_id: str, expires: float) -> None:
    if expires and expires <= time.time():
        raise TokenError(f"token {token_id} expired at {when(expires)}")


def _public(tok: apb.ApiToken) -> apb.ApiToken:
    out = apb.ApiToken()
    out.CopyFrom(tok)
    out.ClearField("secret_hash")
    return out
