"""Identifiers (broker/ids.py): job ids sort by creation and never repeat in a process;
the random part comes from the OS's source a block at a time, each byte handed out once."""

from __future__ import annotations

import os

from broker import ids


def test_job_ids_are_unique_and_sorted_by_creation() -> None:
    made = [ids.new_job_id() for _ in range(10_000)]
    assert len(set(made)) == len(made)
    assert made == sorted(made)
    assert all(len(i) == 19 and i.startswith("j-") for i in made)


def test_random_hex_hands_out_each_os_byte_once(monkeypatch) -> None:  # noqa: ANN001
    """One os.urandom call per block, not one per id; the block is cut in order, and a
    request larger than what is left draws a fresh block."""
    calls: list[int] = []
    blocks = iter([bytes(range(256)) * 16, b"\xab" * 4096])

    def urandom(n: int) -> bytes:
        calls.append(n)
        return next(blocks)

    monkeypatch.setattr(ids, "_random", b"")
    monkeypatch.setattr(ids, "_random_at", 0)
    monkeypatch.setattr(ids.os, "urandom", urandom)
    got = [ids.random_hex(3) for _ in range(1365)]  # 4095 bytes of the first block
    assert calls == [4096]
    assert got[0] == "000102" and got[1] == "030405"
    assert ids.random_hex(3) == "ababab"  # 1 byte left: a new block
    assert calls == [4096, 4096]
    monkeypatch.undo()
    assert len(ids.random_hex(16)) == 32 and os.getpid() == ids._random_pid  # noqa: SLF001
