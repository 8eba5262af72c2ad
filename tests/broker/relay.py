"""A real TCP relay whose upstream connections leave from chosen loopback addresses.

Why: the broker caps streams per peer address, and every test client connects from
127.0.0.1. An attacker with four machines is four source addresses; on Linux every
127.0.0.0/8 address is local, so binding the upstream socket to 127.0.0.2, .3, ...
makes the broker see four distinct peers. Bytes pass through untouched (TLS is end to
end between the client and the broker).
"""

from __future__ import annotations

import contextlib
import socket
import threading


class SourceRelay:
    """Listens on 127.0.0.1:``port``; the n-th accepted connection goes upstream to
    ``target`` from ``sources[n % len(sources)]``."""

    def __init__(self, target: tuple[str, int], sources: list[str]) -> None:
        self.target = target
        self.sources = sources
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._n = 0
        self._closed = threading.Event()
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, name="relay", daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                down, _ = self._sock.accept()
            except OSError:
                return
            src = self.sources[self._n % len(self.sources)]
            self._n += 1
            up = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up.bind((src, 0))
            up.connect(self.target)
            self._conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        for s in self._conns:
            s.close()
