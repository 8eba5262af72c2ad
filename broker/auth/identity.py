"""Who is calling: a :class:`Principal` built ONLY from a verified credential.

Certificate identities are SPIFFE-style URI SANs (one parser, no CN/OU guessing):

* agent: ``spiffe://compute-broker/region/<region>/agent/<agent_id>``
* user:  ``spiffe://compute-broker/team/<team>/role/<role>/user/<name>``
  (operators: ``spiffe://compute-broker/role/operator/user/<name>``)

Why URIs: gRPC exposes the verified peer's URI SANs directly (``peer_uri`` in the
auth context), and a URI carries several typed parts where a CN carries one string.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

TRUST_DOMAIN = "compute-broker"
_SEG = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_AGENT_URI = re.compile(rf"^spiffe://{TRUST_DOMAIN}/region/(?P<region>{_SEG})/agent/(?P<agent>{_SEG})$")
_USER_URI = re.compile(
    rf"^spiffe://{TRUST_DOMAIN}/(?:team/(?P<team>{_SEG})/)?role/(?P<role>{_SEG})/user/(?P<user>{_SEG})$")
NAME_RE = re.compile(rf"^{_SEG}$")


class Role(enum.Enum):
    """What a principal may do is decided by its role (broker/auth/policy.py)."""

    MEMBER = "member"
    TEAM_ADMIN = "team-admin"
    OPERATOR = "operator"
    AGENT = "agent"

    @classmethod
    def parse(cls, value: str) -> Role:
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(r.value for r in cls if r is not cls.AGENT)
            raise ValueError(f"unknown role {value!r}; known: {known}") from None


class CredentialKind(enum.Enum):
    TOKEN = "token"
    CERT = "cert"
    INSECURE_DEV = "insecure-dev"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. ``team`` is "" for operators and agents."""

    name: str
    role: Role
    team: str = ""
    region: str = ""  # agents only
    credential: CredentialKind = CredentialKind.CERT
    token_id: str = ""

    @property
    def actor(self) -> str:
        """How job history and the audit log name this caller."""
        if self.role is Role.AGENT:
            return f"agent:{self.name}"
        if self.credential is CredentialKind.INSECURE_DEV:
            return "insecure-dev"
        return f"user:{self.name}"


INSECURE_DEV_PRINCIPAL = Principal("local-dev", Role.OPERATOR, credential=CredentialKind.INSECURE_DEV)


def agent_uri(region: str, agent_id: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/region/{region}/agent/{agent_id}"


def user_uri(user: str, role: Role, team: str = "") -> str:
    base = f"spiffe://{TRUST_DOMAIN}/"
    return base + (f"team/{team}/" if team else "") + f"role/{role.value}/user/{user}"


def principal_from_uri(uri: str) -> Principal | None:
    """The principal a verified certificate's URI SAN names, or None if it names none."""
    m = _AGENT_URI.match(uri)
    if m:
        return Principal(m["agent"], Role.AGENT, region=m["region"])
    m = _USER_URI.match(uri)
    if m:
        try:
            role = Role.parse(m["role"])
        except ValueError:
            return None
        if role is Role.AGENT or (role is not Role.OPERATOR and not m["team"]):
            return None
        return Principal(m["user"], role, team=m["team"] or "")
    return None
