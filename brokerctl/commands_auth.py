"""brokerctl's security commands: dev-ca (local), whoami, users (tokens), audit.

Operators manage users' bearer tokens here; the secret of a token is printed once
(create/rotate) and stored by the broker only as an argon2 hash.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from brokerctl import render
from brokerctl.common import EXIT_OK, UsageError, parse_duration, parse_time, show_list
from brokersdk.client import BrokerClient


def add_parsers(add: object) -> None:
    """Register dev-ca, whoami, users and audit on the main parser (``add`` = its helper)."""
    s = add("dev-ca", "DEV: make a CA, broker/agent/user credentials and a client config")  # type: ignore[operator]
    s.add_argument("dir", help="directory to write into (created)")
    s.add_argument("--server", default="127.0.0.1:50051", help="broker address for token contexts")
    s.add_argument("--mtls-server", default="127.0.0.1:50052",
                   help="the broker's mutual-TLS address (agent_listen) for certificate contexts")
    s.add_argument("--agent", action="append", metavar="REGION[/AGENT_ID]",
                   help="agent certificate(s) to make (default: 3 demo regions)")
    s.add_argument("--user", action="append", metavar="NAME:ROLE[:TEAM]",
                   help="users (default admin:operator, alice:member:ml, carol:team-admin:ml)")
    s.set_defaults(local=cmd_dev_ca)

    s = add("whoami", "who the broker thinks you are", output=True)  # type: ignore[operator]
    s.set_defaults(func=cmd_whoami)

    s = add("users", "operators: users' bearer tokens (list, create, revoke, rotate)", output=True)  # type: ignore[operator]
    us = s.add_subparsers(dest="users_cmd", metavar="[list|create|revoke|rotate]")
    ul = us.add_parser("list", help="list tokens")
    ul.add_argument("--user", default="")
    ul.add_argument("--all", action="store_true", help="include revoked tokens")
    uc = us.add_parser("create", help="create a token for a user (prints the secret once)")
    uc.add_argument("user")
    uc.add_argument("--team", default="")
    uc.add_argument("--role", default="member", help="member | team-admin | operator")
    uc.add_argument("--ttl", default="", metavar="DURATION",
                    help="lifetime, e.g. 12h, 30d (default: the broker's, 90 days unless"
                         " its operator changed it)")
    ur = us.add_parser("revoke", help="revoke a token (by id)")
    ur.add_argument("token_id")
    ut = us.add_parser("rotate", help="new secret for a token (the old one stops working)")
    ut.add_argument("token_id")
    s.set_defaults(func=cmd_users, user="", all=False)

    s = add("audit", "operators: the audit log of mutations, newest first", output=True)  # type: ignore[operator]
    s.add_argument("--user", default="", help="only this actor (alice, user:alice, agent:x)")
    s.add_argument("--since", default="", help="e.g. --since=-1h (an hour ago), an epoch or ISO 8601")
    s.add_argument("--limit", type=int, default=100)
    s.set_defaults(func=cmd_audit)


def _parse_user(spec: str) -> tuple[str, object, str]:
    from broker.auth.identity import Role

    name, _, rest = spec.partition(":")
    role_s, _, team = rest.partition(":")
    try:
        role = Role.parse(role_s or "member")
    except ValueError as e:
        raise UsageError(f"--user {spec!r}: {e}") from None
    if not name or (role is not Role.OPERATOR and not team):
        raise UsageError(f"--user expects NAME:ROLE[:TEAM] (a team for non-operators), got {spec!r}")
    return name, role, team


def cmd_dev_ca(args: argparse.Namespace, out: Console) -> int:
    from broker.auth.devca import create_dev_pki

    agents = None
    if args.agent:
        agents = []
        for a in args.agent:
            region, _, agent_id = a.partition("/")
            agents.append((region, agent_id or f"{region}-agent"))
    users = [_parse_user(u) for u in args.user] if args.user else None
    pki = create_dev_pki(Path(args.dir), server=args.server, mtls_server=args.mtls_server,
                         agents=agents, users=users)  # type: ignore[arg-type]
    root = pki.ca.root
    out.print(f"[bold]dev CA in {root}[/] [yellow](development only: keys unencrypted)[/]")
    out.print(f"  broker:  brokerctl serve --config {root / 'broker.yaml'}")
    for agent_pem in sorted((root / "agents").glob("*.pem")):
        out.print(f"  agent:   brokerctl agent --cert {agent_pem} --key {agent_pem.with_suffix('.key')}"
                  f" --ca {pki.ca.ca_cert_path} ...")
    out.print(f"  clients: export CB_CONFIG={pki.client_config}   (contexts: "
              f"{', '.join(pki.tokens)} and <name>-cert)")
    return EXIT_OK


def cmd_whoami(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    p = client.whoami()
    if args.output == "json":
        out.print_json(render.to_json(p))
        return EXIT_OK
    out.print(f"{p.name} ({p.role}" + (f", team {p.team}" if p.team else "")
              + (f", region {p.region}" if p.region else "") + f") via {p.credential}")
    return EXIT_OK


def cmd_users(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    sub = getattr(args, "users_cmd", None) or "list"
    if sub in ("create", "rotate"):
        issued = (client.create_token(args.user, args.team, args.role, _ttl(args.ttl))
                  if sub == "create" else client.rotate_token(args.token_id))
        if args.output == "json":
            out.print_json(render.to_json(issued))
            return EXIT_OK
        t = issued.token
        out.print(f"token {t.id} for {t.user} ({t.role}{', team ' + t.team if t.team else ''})"
                  + (f", expires {when(t.expires_time)}" if t.expires_time else ", never expires"))
        out.print("[bold]secret (shown once):[/]")
        out.print(issued.secret, soft_wrap=True, highlight=False)
        out.print("[dim]use it: export CB_TOKEN=<secret>[/]")
        return EXIT_OK
    if sub == "revoke":
        t = client.revoke_token(args.token_id)
        out.print(f"revoked token {t.id} of {t.user}")
        return EXIT_OK
    return show_list(args, out, client.list_tokens(args.user, args.all), "[dim]no tokens[/]",
                     render.tokens_table)


def when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _ttl(text: str) -> float:
    """``--ttl`` in seconds (0 = the broker's default)."""
    if not text:
        return 0.0
    try:
        seconds = parse_duration(text.removeprefix("+"))
    except UsageError:
        raise UsageError(f"--ttl {text!r}: give a duration such as 12h, 30d or 1d12h") from None
    if seconds <= 0:
        raise UsageError(f"--ttl {text!r}: a token's lifetime must be positive")
    return seconds


def cmd_audit(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    since = 0.0
    if args.since:
        s = args.since.strip()
        # "-1h" = one hour ago; else what parse_time takes (now, epoch, ISO 8601)
        since = time.time() - parse_time("+" + s[1:], now=0.0) if s.startswith("-") else parse_time(s)
    if args.limit < 1 or args.limit > 10_000:
        raise UsageError("--limit must be between 1 and 10000")
    return show_list(args, out, client.audit(args.user, since, args.limit),
                     "[dim]no audit records[/]", render.audit_table)
