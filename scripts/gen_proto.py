#!/usr/bin/env python3
"""Regenerate the Python stubs of the gRPC API from proto/computebroker/v1/*.proto.

Why one script: the generated code is committed (so a plain `pip install` needs no
code generator), and tests/test_proto_fresh.py runs this script into a temporary
directory and fails when the committed stubs differ, so they can never go stale.

Usage: python scripts/gen_proto.py [--out DIR]   (default: proto/, in place)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("computebroker") / "v1"


def generate(out: Path) -> list[Path]:
    """Run grpcio-tools' protoc on every .proto; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    if not sources:
        raise SystemExit(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    (out / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *sources,
    ]
    rc = protoc.main(args)
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")
    for pkg in (out / "computebroker", out / PACKAGE_DIR):
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated gRPC API of Compute Broker (see scripts/gen_proto.py)."""\n')
    return sorted((out / PACKAGE_DIR).glob("*_pb2*.py*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root (default: proto/)")
    ns = parser.parse_args(argv)
    for path in generate(ns.out):
        print(path.relative_to(ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
