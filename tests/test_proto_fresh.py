"""The committed gRPC stubs must equal what scripts/gen_proto.py produces now.

Why: the stubs are committed so installs need no code generator; this test is what
keeps them from drifting away from the .proto sources.
"""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GENERATED = ROOT / "proto" / "computebroker" / "v1"


def test_generated_stubs_are_fresh(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    fresh = sorted(p.name for p in (tmp_path / "computebroker" / "v1").glob("*_pb2*.py*"))
    committed = sorted(p.name for p in GENERATED.glob("*_pb2*.py*"))
    assert fresh, "the generator wrote no stubs"
    assert fresh == committed, f"stub files differ: generated {fresh}, committed {committed}"
    stale = [
        name
        for name in fresh
        if not filecmp.cmp(tmp_path / "computebroker" / "v1" / name, GENERATED / name, shallow=False)
    ]
    assert not stale, (
        f"committed stubs are stale: {stale}. Run `python scripts/gen_proto.py` and commit the result."
    )


def test_every_proto_has_stubs() -> None:
    protos = sorted(p.stem for p in GENERATED.glob("*.proto"))
    assert protos == ["agent", "auth", "capacity", "common", "jobs", "logs", "workdir", "worker_link"]
    for stem in protos:
        assert (GENERATED / f"{stem}_pb2.py").exists()
        assert (GENERATED / f"{stem}_pb2.pyi").exists()
        assert (GENERATED / f"{stem}_pb2_grpc.py").exists()
