"""The web console beside `brokerctl demo`: started in the demo's own process so a person
can watch the cross-region story in a browser while the terminal prints it.

Why in-process and on a free loopback port: the demo is one command on a fresh machine;
asking the user to start a second process (and pick a port that may be taken) would hide
the console exactly when it is most useful. The console stays a plain client of the
broker (TLS + the demo operator's token, typed in on the sign-in page), as always."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass

from brokersdk.credentials import ClientCredentials
from console.app import ConsoleConfig, create_app
from console.identity import ClientSettings


@dataclass
class DemoConsole:
    """A console serving on loopback until ``stop()``."""

    url: str
    _server: object
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True  # type: ignore[attr-defined]
        self._thread.join(timeout=5)


def start(broker: str, ca: str, timeout_s: float = 20.0) -> DemoConsole | None:
    """Serve the console for ``broker`` (TLS, CA file ``ca``) on 127.0.0.1:<free port>.
    None when it could not start in ``timeout_s`` (the demo goes on without it)."""
    import uvicorn

    config = ConsoleConfig(broker=broker, timeout=10.0)
    settings = ClientSettings(broker, 10.0, ClientCredentials(ca=ca))
    app = create_app(config, settings=settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, server_header=False,
                                           timeout_graceful_shutdown=1))
    ready = threading.Event()
    bound: list[str] = []
    original = server.startup

    async def startup(sockets=None) -> None:  # noqa: ANN001 - uvicorn's signature
        await original(sockets)
        if server.servers:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            bound.append(f"http://{host}:{port}/")
        ready.set()

    server.startup = startup  # type: ignore[method-assign]

    def run() -> None:
        with contextlib.suppress(Exception):
            asyncio.run(server.serve())
        ready.set()
        with contextlib.suppress(Exception):
            app.state.sessions.close_all()

    thread = threading.Thread(target=run, name="demo-console", daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or not bound:
        server.should_exit = True
        return None
    return DemoConsole(url=bound[0], _server=server, _thread=thread)
