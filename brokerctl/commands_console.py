"""`brokerctl console`: the web console (console/), a client of this broker like the CLI."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from brokerctl.common import EXIT_OK, UsageError

DEFAULT_LISTEN = "127.0.0.1:8080"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where the console serves HTTP (default {DEFAULT_LISTEN}; port 0 = any)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", metavar="PEM", help="... and this private key")
    p.add_argument("--insecure-cookie", action="store_true",
                   help="session cookie without Secure (plain HTTP beyond loopback: unsafe)")


def cmd_console(args: argparse.Namespace, out: Console) -> int:
    from console.app import ConsoleConfig
    from console.server import parse_listen, serve

    try:
        parse_listen(args.listen)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    from console.identity import ClientSettings

    context = getattr(args, "context", None) or ""
    try:  # the transport (CA, address) as every client resolves it; users bring identities
        broker = ClientSettings.resolve(args.broker or os.environ.get("BROKER_ADDRESS") or "",
                                        args.timeout, context).address
    except ValueError as e:
        raise UsageError(str(e)) from None
    config = ConsoleConfig(broker=broker, timeout=args.timeout, context=context,
                           secure_cookie=not args.insecure_cookie)

    def ready(url: str) -> None:
        out.print(f"console for broker {broker} at [bold]{url}[/] (Ctrl-C stops it)")

    serve(config, args.listen, tls_cert=args.tls_cert, tls_key=args.tls_key, on_ready=ready)
    return EXIT_OK
