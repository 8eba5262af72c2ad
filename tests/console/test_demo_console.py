"""The console `brokerctl demo` serves beside itself (console/demo.py): a real broker over
TLS, the console on a free loopback port, a real sign-in with the operator's token, and the
fleet page showing the broker's regions (plain HTTP requests: the browser tests cover the
pages themselves)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from console.demo import start
from tests.broker.harness import Broker, FakeAgent, fast_config, nodes_for
from tests.fixtures.pki import session_pki


def test_demo_console_serves_the_fleet_to_the_signed_in_operator(tmp_path: Path) -> None:
    pki = session_pki()
    b = Broker(fast_config(tmp_path))
    agent = FakeAgent(b.address, "demo-a", "us-west-2", nodes_for("us-west-2", "uw2", 1, 8))
    agent.connect()
    web = start(b.address, pki.ca_file)
    try:
        assert web is not None and web.url.startswith("http://127.0.0.1:")
        page = urllib.request.urlopen(web.url + "signin", timeout=30).read().decode()
        assert "Sign in" in page

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
                return None

        req = urllib.request.Request(
            web.url + "signin", data=urllib.parse.urlencode({"token": pki.operator_token}).encode(),
            headers={"Origin": web.url.rstrip("/")})
        try:
            urllib.request.build_opener(NoRedirect).open(req, timeout=30)
            raise AssertionError("sign-in should redirect to the fleet page")
        except urllib.error.HTTPError as e:  # the 303 to /fleet, with the session cookie
            assert e.code == 303 and e.headers["Location"].endswith("/fleet")
            cookie = e.headers["Set-Cookie"].split(";")[0]
        # urllib's cookie jar withholds Secure cookies over http even on loopback (browsers
        # keep them there): send it by hand.
        fleet = urllib.request.urlopen(urllib.request.Request(
            web.url + "fleet", headers={"Cookie": cookie}), timeout=30).read().decode()
        assert "us-west-2" in fleet
    finally:
        if web is not None:
            web.stop()
        agent.close()
        b.stop()
