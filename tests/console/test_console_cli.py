"""`brokerctl console`: bad flags are one line and exit 2, before anything listens."""

from __future__ import annotations

import pytest

from brokerctl.main import main
from console.server import parse_listen


@pytest.mark.parametrize(("argv", "needle"), [
    (["console", "--listen", "nonsense"], "--listen expects HOST:PORT"),
    (["console", "--listen", "127.0.0.1:99999"], "--listen expects HOST:PORT"),
    (["console", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
])
def test_bad_console_flags_are_one_line_and_exit_2(argv: list[str], needle: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_listen_addresses() -> None:
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
