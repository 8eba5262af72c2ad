"""The broker's state is not readable by other users of its host (a job user on the
same machine read a secret out of the SQLite store and its WAL when they were 0644).

As root, the read is tried for real as ``nobody`` in a directory anyone may traverse
(as an operator's ``var/`` usually is); otherwise only the modes are checked."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.harness import Broker, fast_config, spec

SECRET = "hf_S3CR3T_in_the_env_" + "x" * 12
NOBODY = 65534
READ = """
import os, sys
out = []
for p in sys.argv[1:]:
    try:
        if os.path.isdir(p):
            os.listdir(p)
        else:
            with open(p, 'rb') as f:
                out.append(f.read())
        print('READ', p)
    except PermissionError:
        print('DENIED', p)
sys.stdout.flush()
sys.exit(3 if any(b'hf_S3CR3T' in d for d in out) else 0)
"""


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A 0755 directory under /tmp (pytest's own tmp dirs are 0700: no real test)."""
    d = Path(tempfile.mkdtemp(prefix="cb-private-"))
    d.chmod(0o755)
    old = os.umask(0o022)
    try:
        yield d
    finally:
        os.umask(old)
        shutil.rmtree(d, ignore_errors=True)


def test_store_wal_shm_and_workdirs_are_private(shared_dir: Path) -> None:
    var = shared_dir / "var"
    var.mkdir(mode=0o755)
    b = Broker(fast_config(shared_dir, store=f"sqlite:///{var / 'broker.sqlite'}"))
    try:
        b.team()
        b.submit(spec("with-secret", env={"HF_TOKEN": SECRET}))
        db = var / "broker.sqlite"
        paths = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        workdirs = var / "workdirs"
        for p in paths:
            assert p.exists(), p
        if os.geteuid() == 0:  # the attack itself: another user of the host reads
            targets = [str(p) for p in paths] + ([str(workdirs)] if workdirs.exists() else [])
            r = subprocess.run(["/usr/bin/python3", "-c", READ, *targets], user=NOBODY,
                               group=NOBODY, extra_groups=[], capture_output=True, text=True,
                               timeout=60, check=False)
            assert r.returncode == 0, f"nobody read the secret: {r.stdout}{r.stderr}"
            assert r.stdout.count("DENIED") == len(targets), r.stdout + r.stderr
        for p in paths:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, (p, oct(p.stat().st_mode))
        for lock in var.glob("broker.sqlite.*lock"):
            assert stat.S_IMODE(lock.stat().st_mode) & 0o077 == 0, lock
        if workdirs.exists():
            assert stat.S_IMODE(workdirs.stat().st_mode) & 0o077 == 0
    finally:
        b.stop()


def test_an_old_loose_store_is_tightened_at_start(shared_dir: Path) -> None:
    db = shared_dir / "old.sqlite"
    b = Broker(fast_config(shared_dir, store=f"sqlite:///{db}"))
    b.stop()
    for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if p.exists():
            p.chmod(0o644)
    b = Broker(fast_config(shared_dir, store=f"sqlite:///{db}"))
    try:
        for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            if p.exists():
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    finally:
        b.stop()
