"""Run the console under uvicorn (`brokerctl console`)."""

from __future__ import annotations

from collections.abc import Callable

from console.app import ConsoleConfig, create_app


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (IPv6 as ``[::1]:8080``) -> (host, port); ValueError when malformed."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not host or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen expects HOST:PORT, got {listen!r}")
    return host.strip("[]"), int(port)


def serve(config: ConsoleConfig, listen: str, *, tls_cert: str | None = None,
          tls_key: str | None = None, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM; ``on_ready(url)`` once the socket listens."""
    import uvicorn

    host, port = parse_listen(listen)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level="warning", ssl_certfile=tls_cert,
        ssl_keyfile=tls_key, timeout_graceful_shutdown=2, access_log=False,
        server_header=False))

    scheme = "https" if tls_cert else "http"
    original = server.startup

    async def startup(sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        await original(sockets)
        if on_ready is not None and server.servers:
            bound = server.servers[0].sockets[0].getsockname()
            shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
            on_ready(f"{scheme}://{shown}:{bound[1]}/")

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run()
    finally:
        app.state.sessions.close_all()
