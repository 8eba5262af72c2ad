"""Who is signed in, what they may do, and the SDK client that acts as them.

Why a seam here: every broker call of the console must carry the signed-in user's own
credential, so the broker's roles decide what the console can read and do (the console
never holds a privileged credential of its own). :func:`client_for` is the one place
that turns a session's credential into a :class:`brokersdk.BrokerClient`; the role
shown in the page (which only hides buttons a user may not press: the broker enforces)
comes from :func:`identify`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from brokersdk.client import BrokerClient, BrokerError, PermissionDenied


class Role(enum.Enum):
    """The broker's roles (DESIGN.md "Security"), weakest first."""

    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    OPERATOR = "operator"

    @property
    def can_operate(self) -> bool:
        """Drain / cordon / cancel-any buttons are shown to operators only."""
        return self is Role.OPERATOR


@dataclass(frozen=True)
class Identity:
    """The signed-in user as the broker sees them."""

    user: str
    role: Role
    teams: tuple[str, ...] = ()
    authenticated: bool = True  # False: the broker runs without authentication

    @property
    def label(self) -> str:
        who = self.user if self.authenticated else "no authentication"
        return f"{who} · {self.role.value}"


class SessionLike(Protocol):
    token: str


@dataclass
class ClientSettings:
    """How to reach the broker (the same for every user; the credential differs)."""

    address: str
    timeout: float = 10.0
    extra: dict[str, Any] = field(default_factory=dict)


def client_for(session: SessionLike, settings: ClientSettings) -> BrokerClient:
    """An SDK client that speaks as the session's user.

    The bearer token travels as gRPC ``authorization`` metadata (the usual gRPC
    convention), so a broker with authentication sees the user, never the console.
    An empty token (a broker without authentication) sends no credential.
    """
    metadata = [("authorization", f"Bearer {session.token}")] if session.token else []
    return BrokerClient(settings.address, timeout=settings.timeout, retries=1,
                        metadata=metadata, **settings.extra)


def identify(client: BrokerClient, token: str) -> Identity:
    """The user behind ``client``'s credential; raises BrokerError when it is refused.

    A broker that knows identities answers ``whoami``; one without authentication has no
    such call, and every caller may do everything there (reported as such in the page).
    """
    whoami = getattr(client, "whoami", None)
    if whoami is None:
        client.regions()  # proves the broker answers this credential at all
        return Identity(user="anonymous", role=Role.OPERATOR, authenticated=False)
    info = whoami()
    role = _parse_role(getattr(info, "role", ""))
    teams = tuple(getattr(info, "teams", ()) or ())
    return Identity(user=str(getattr(info, "user", "") or "user"), role=role, teams=teams)


def _parse_role(value: Any) -> Role:
    text = str(getattr(value, "name", value)).lower().replace("_", "-")
    for role in (Role.OPERATOR, Role.TEAM_ADMIN, Role.MEMBER):
        if role.value in text or role.name.lower().replace("_", "-") in text:
            return role
    return Role.MEMBER


__all__ = ["BrokerError", "ClientSettings", "Identity", "PermissionDenied", "Role",
           "client_for", "identify"]
