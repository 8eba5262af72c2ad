"""Who is signed in, what they may do, and the SDK client that acts as them.

Why a seam here: every broker call of the console must carry the signed-in user's own
credential, so the broker's roles decide what the console can read and do (the console
never uses a privileged credential of its own). :func:`client_for` is the one place that
turns a session's token into a :class:`brokersdk.BrokerClient`; the role shown in the
page (which only hides buttons a user may not press: the broker enforces) comes from
:func:`identify`, i.e. the broker's ``WhoAmI``.

The transport (TLS and the CA that signed the broker's certificate, or an insecure dev
broker) is the console operator's setting, resolved like every SDK client's
(``CB_CA`` / ``CB_INSECURE`` / the config file's context, brokersdk/credentials.py); the
identity in it (its token or client certificate) is dropped, so a session without a
valid token of its own gets nothing.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Protocol

from brokersdk.client import DEFAULT_ADDRESS, BrokerClient, BrokerError, PermissionDenied
from brokersdk.credentials import ClientCredentials, resolve


class Role(enum.Enum):
    """The broker's roles (DESIGN.md "Security"), weakest first."""

    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    OPERATOR = "operator"

    @property
    def can_operate(self) -> bool:
        """Drain / cordon / cancel buttons are shown to operators only."""
        return self is Role.OPERATOR

    @classmethod
    def parse(cls, value: str) -> Role:
        """The broker's role name; anything unknown (e.g. "agent") reads as a member."""
        try:
            return cls(str(value).strip().lower().replace("_", "-"))
        except ValueError:
            return cls.MEMBER


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
        team = f" ({', '.join(self.teams)})" if self.teams else ""
        return f"{who}{team} · {self.role.value}"


class SessionLike(Protocol):
    token: str


@dataclass
class ClientSettings:
    """How to reach the broker: the same for every user (the credential differs)."""

    address: str
    timeout: float = 10.0
    transport: ClientCredentials = field(default_factory=ClientCredentials)  # no identity

    @classmethod
    def resolve(cls, address: str, timeout: float = 10.0, context: str = "") -> ClientSettings:
        """The console operator's transport settings (CA, insecure dev; the address when
        none is given), minus any identity. Raises ValueError for an unusable config."""
        base = resolve(context=context)
        return cls(address or base.server or DEFAULT_ADDRESS, timeout,
                   dataclasses.replace(base, server="", token="", client_cert="",
                                       client_key=""))


def client_for(session: SessionLike, settings: ClientSettings) -> BrokerClient:
    """An SDK client that speaks as the session's user: TLS to the broker, the user's
    bearer token on every call (none for an empty token: the broker then refuses)."""
    creds = dataclasses.replace(settings.transport, token=session.token)
    return BrokerClient(settings.address, timeout=settings.timeout, retries=1,
                        credentials=creds)


def identify(client: BrokerClient) -> Identity:
    """The user behind ``client``'s credential (the broker's WhoAmI); raises BrokerError
    (NotAuthenticated) when the broker refuses it. A dev broker without authentication
    (``--insecure-dev``) answers for a local operator: the page says so."""
    p = client.whoami()
    insecure = p.credential == "insecure-dev"
    return Identity(user=p.name or "user", role=Role.parse(p.role),
                    teams=(p.team,) if p.team else (), authenticated=not insecure)


__all__ = ["BrokerError", "ClientSettings", "Identity", "PermissionDenied", "Role",
           "client_for", "identify"]
