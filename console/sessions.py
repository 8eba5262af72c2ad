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


class SessionsFull(Exception):
    """No room for another signed-in user's session (the message says what to do)."""


class SessionStore:
    """Sessions by id, forgotten after ``idle_s`` without a request.

    Bounded per user, not in one shared table: each user keeps at most
    ``per_user`` sessions (a new one retires that user's own least recently used), and
    all users together at most ``max_sessions`` (each holds a broker channel). When that
    is full a new user's sign-in is refused, nobody else's session is evicted, and
    operators are always let in. Why: with one shared LRU table of 256, a member who
    signed in 256 times pushed the operator's session out.
    """

    def __init__(self, idle_s: float = 8 * 3600, max_sessions: int = 4096,
                 per_user: int = 16) -> None:
        self.idle_s = idle_s
        self.max_sessions = max_sessions
        self.per_user = per_user
        self._sessions: dict[str, Session] = {}
        self._by_user: dict[str, dict[str, Session]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _user(identity: Identity) -> str:
        return f"{identity.role.value}:{identity.user}"

    def create(self, token: str, identity: Identity, client: Any) -> Session:
        session = Session(id=secrets.token_urlsafe(32), token=token, identity=identity,
                          client=client)
        user = self._user(identity)
        evicted: list[Session] = []
        with self._lock:
            self._expire(time.time())
            mine = self._by_user.setdefault(user, {})
            while len(mine) >= self.per_user:
                oldest = min(mine.values(), key=lambda s: s.last_used)
                evicted.append(self._pop(oldest.id))
            if len(self._sessions) >= self.max_sessions and not identity.role.can_operate:
                if not mine:
                    self._by_user.pop(user, None)
                for s in evicted:
                    s.close()
                raise SessionsFull(f"the console holds its maximum of {self.max_sessions}"
                                   " sessions; try again later (an operator can sign in)")
            self._sessions[session.id] = session
            mine[session.id] = session
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
            session = self._pop(session_id or "")
        if session is not None:
            session.close()

    def close_all(self) -> None:
        with self._lock:
            sessions, self._sessions, self._by_user = list(self._sessions.values()), {}, {}
        for s in sessions:
            s.close()

    def count(self, identity: Identity | None = None) -> int:
        """Open sessions (of one user)."""
        with self._lock:
            if identity is None:
                return len(self._sessions)
            return len(self._by_user.get(self._user(identity), {}))

    def _pop(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            user = self._user(session.identity)
            mine = self._by_user.get(user, {})
            mine.pop(session_id, None)
            if not mine:
                self._by_user.pop(user, None)
        return session

    def _expire(self, now: float) -> None:
        for sid in [k for k, s in self._sessions.items() if now - s.last_used > self.idle_s]:
            s = self._pop(sid)
            if s is not None:
                s.close()


def cookie_args(secure: bool) -> dict[str, Any]:
    """The cookie's attributes (one place, so every response sets them alike)."""
    return {"httponly": True, "samesite": "strict", "secure": secure, "path": "/"}
