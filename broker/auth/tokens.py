"""Users' bearer tokens: ``cbt_<id>_<secret>``, stored as argon2id hashes in the store.

Why this shape: the id part makes verification one keyed lookup (never a scan of all
hashes); argon2id makes a stolen store useless for minting tokens; and because argon2
costs tens of milliseconds by design, a successful verification is cached in memory
keyed by the SHA-256 of the whole token, so only a token's first use per broker (and
per :data:`CACHE_TTL_S`) pays it. Revoke/rotate drop the token's cache entries at once
on this replica; other replicas of an HA pair notice within the cache TTL.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
import time
from pathlib import Path

import yaml
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from broker.auth.identity import NAME_RE, CredentialKind, Principal, Role
from broker.store.base import Store
from computebroker.v1 import auth_pb2 as apb

KIND_TOKEN = "token"  # store record kind: ApiToken, key = token id
TOKEN_RE = re.compile(r"^cbt_(?P<id>[0-9a-f]{12})_(?P<secret>[A-Za-z0-9_-]{20,100})$")
CACHE_TTL_S = 30.0
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


class TokenManager:
    def __init__(self, store: Store, static: dict[str, apb.ApiToken] | None = None) -> None:
        self.store = store
        self.static = dict(static or {})
        self._lock = threading.Lock()
        self._cache: dict[bytes, tuple[float, Principal]] = {}

    # ---- operators ------------------------------------------------------------------
    def create(self, user: str, team: str, role: Role, created_by: str) -> apb.IssuedToken:
        if not NAME_RE.match(user):
            raise ValueError(f"user {user!r}: use letters, digits, '.', '_' or '-' (max 128)")
        if role is Role.AGENT:
            raise ValueError("agents authenticate with certificates, not tokens")
        if role is not Role.OPERATOR and not NAME_RE.match(team):
            raise ValueError(f"a {role.value} needs a team (got {team!r})")
        tok = apb.ApiToken(id=secrets.token_hex(6), user=user,
                           team="" if role is Role.OPERATOR else team, role=role.value,
                           created_time=time.time(), created_by=created_by)
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
        self.store.put_record(KIND_TOKEN, tok.id, tok)
        self._forget(token_id)
        return _public(tok)

    def rotate(self, token_id: str) -> apb.IssuedToken:
        """A new secret for the same token id; the old secret stops working at once."""
        tok = self.get(token_id)
        if tok.revoked:
            raise ValueError(f"token {token_id} is revoked; create a new one")
        tok.rotated_time = time.time()
        self._forget(token_id)
        return self._issue(tok)

    # ---- every RPC --------------------------------------------------------------------
    def verify(self, token: str) -> Principal:
        key = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        m = TOKEN_RE.match(token)
        if not m:
            raise TokenError("malformed token (expected cbt_<id>_<secret>)")
        tok = self.static.get(m["id"]) or self.store.get_record(KIND_TOKEN, m["id"], apb.ApiToken)
        if tok is None or tok.revoked:  # type: ignore[union-attr]
            raise TokenError(f"token {m['id']} is unknown or revoked")
        try:
            _HASHER.verify(tok.secret_hash, m["secret"])  # type: ignore[union-attr]
        except (VerificationError, InvalidHashError):
            raise TokenError(f"token {m['id']}: wrong secret (rotated?)") from None
        principal = Principal(tok.user, Role.parse(tok.role), team=tok.team,  # type: ignore[union-attr]
                              credential=CredentialKind.TOKEN, token_id=tok.id)  # type: ignore[union-attr]
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now + CACHE_TTL_S, principal)
        return principal

    def _forget(self, token_id: str) -> None:
        with self._lock:
            for k in [k for k, (_, p) in self._cache.items() if p.token_id == token_id]:
                del self._cache[k]


def _public(tok: apb.ApiToken) -> apb.ApiToken:
    out = apb.ApiToken()
    out.CopyFrom(tok)
    out.ClearField("secret_hash")
    return out
