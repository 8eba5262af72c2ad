"""Server-side browser sessions: an opaque id in a cookie, the credential stays here.

Why server-side: the user's bearer token is a secret; a signed cookie would send it back
to the browser on every request. Here the cookie holds only a random session id
(HttpOnly: no script reads it; SameSite=strict: no other site's page sends it; Secure:
only over TLS or loopback), and signing out forgets the credential at once.

CSRF: each session has a random token that every POST form must echo
(:meth:`Session.csrf_ok`), on top of SameSite=strict and an Origin check in ``app``.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from console.identity import Identity

COOKIE = "cb_console"


@dataclass
class Session:
    """One signed-in browser: the credential, who it is, and its SDK client."""

    id: str
    token: str
    identity: Identity
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    client: Any = None  # brokersdk.BrokerClient made by identity.client_for
    flash: str = ""  # the outcome of the last action, shown once on the next page

    def csrf_ok(self, value: str | None) -> bool:
        return bool(value) and hmac.compare_digest(self.csrf, str(value))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class SessionStore:
    """Sessions by id, forgotten after ``idle_s`` without a request; at most
    ``max_sessions`` (each holds a broker channel): the least recently used goes first."""

    def __init__(self, idle_s: float = 8 * 3600, max_sessions: int = 256) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self, token: str, identity: Identity, client: Any) -> Session:
        session = Session(id=secrets.token_urlsafe(32), token=token, identity=identity,
                          client=client)
        evicted: list[Session] = []
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > self.max_sessions:
                oldest = min(self._sessions.values(), key=lambda s: s.last_used)
                evicted.append(self._sessions.pop(oldest.id))
        for s in evicted:
            s.close()
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        now = time.time()
        with self._lock:
            self._expire(now)
            session = self._sessions.get(session_id)
            if session is not None:
                session.last_used = now
            return session

    def drop(self, session_id: str | None) -> None:
        with self._lock:
            session = self._sessions.pop(session_id or "", None)
        if session is not None:
            session.close()

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.close()

    def _expire(self, now: float) -> None:
        for sid in [k for k, s in self._sessions.items() if now - s.last_used > self.idle_s]:
            self._sessions.pop(sid).close()


def cookie_args(secure: bool) -> dict[str, Any]:
    """The cookie's attributes (one place, so every response sets them alike)."""
    return {"httponly": True, "samesite": "strict", "secure": secure, "path": "/"}
