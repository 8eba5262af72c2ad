"""``TokenManager.cached``: what the API workers' event loop asks before handing a
token to a thread. It answers only from a fresh verification (no store read, no
argon2), never for an unknown token, and still refuses an expired one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker.auth import tokens as tokens_mod
from broker.auth.identity import Role
from broker.auth.tokens import TokenError, TokenManager
from broker.store import open_store


def test_cached_answers_only_what_verify_answered_recently(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        tm = TokenManager(store, cache_ttl_s=60)
        issued = tm.create("erin", "ml", Role.MEMBER, "test")
        assert tm.cached(issued.secret) is None  # never verified here: the thread's job
        p = tm.verify(issued.secret)
        assert tm.cached(issued.secret) == p
        assert tm.cached(issued.secret + "x") is None
        later = time.monotonic() + 61  # the cache entry's life has passed (no sleeping)
        monkeypatch.setattr(tokens_mod.time, "monotonic", lambda: later)
        assert tm.cached(issued.secret) is None  # stale: re-read by verify, not guessed
    finally:
        store.close()


def test_cached_refuses_a_token_that_expired_inside_its_cache_life(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'b.sqlite'}")
    try:
        tm = TokenManager(store, cache_ttl_s=3600)
        issued = tm.create("erin", "ml", Role.MEMBER, "test", ttl_s=600)
        tm.verify(issued.secret)
        later = time.time() + 601  # the token's own lifetime has passed, its cache entry's not
        monkeypatch.setattr(tokens_mod.time, "time", lambda: later)
        with pytest.raises(TokenError, match="expired"):
            tm.cached(issued.secret)
    finally:
        store.close()
