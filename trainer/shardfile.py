"""The layout of one checkpoint shard file: a safetensors file of raw tensor bytes.

Why not DCP's default (one `torch.save` zip per tensor, inside each `.distcp` file):
measured on the 200m checkpoint (benchmarks/bench_checkpoint.py), saving paid for the
zip writer's CRC32 and a pickle per tensor, and loading paid for `torch.load` copying
every tensor into freshly allocated memory (page faults cost ~1-3 s/GB on these VMs)
and then again into the model. With raw bytes at offsets known before any I/O, a save
writes straight out of the tensors' memory and a load reads straight into the live
parameters and optimizer state: one copy each way, like `cp`.

Why safetensors: it is the open, documented layout for exactly this (an 8-byte
little-endian header length, a JSON header giving each tensor's dtype, shape and byte
range, then the bytes, no holes). Any shard can be opened with `safetensors.safe_open`
and inspected without this code. The header also carries the DCP sharding info under
the keys torch's own safetensors writer uses (`DCP_SHARDING_INFO` with `saved_offsets`).

DCP's `.metadata` still maps every chunk of every tensor to (file, byte offset, length);
those items carry the transform descriptor `RAW_DESCRIPTOR`, so a stock DCP
`FileSystemReader` refuses them ("Unknown extension") instead of misreading raw bytes
as a torch.save archive. Everything here is pure (no I/O).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import torch

RAW_DESCRIPTOR = "cb-raw-bytes/1"
FORMAT_KEY = "cb_shard_format"  # in the safetensors __metadata__; value FORMAT_VERSION
FORMAT_VERSION = "1"
BYTE_ITEMS_KEY = "cb_byte_items"  # names of entries that are pickled objects, not tensors
SHARDING_KEY = "DCP_SHARDING_INFO"  # torch's key: {name: {"saved_offsets": [...]}}
HEADER_LEN_BYTES = 8

# safetensors dtype names (the spec's; a dtype outside this map is stored as U8 bytes
# and described by DCP's metadata, which is what loading uses anyway)
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor as a flat, writable memoryview: no copy.

    Reading into it writes the tensor; writing it out reads the tensor.
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    flat = t.detach().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


@dataclass(frozen=True)
class Entry:
    """One stored object: a tensor chunk, or a pickled object (`is_bytes`)."""

    name: str
    nbytes: int
    dtype: str = "U8"
    shape: tuple[int, ...] = ()
    saved_offsets: tuple[int, ...] | None = None  # the chunk's place in the full tensor
    is_bytes: bool = False


def tensor_entry(name: str, t: torch.Tensor, saved_offsets: tuple[int, ...]) -> Entry:
    nbytes = t.numel() * t.element_size()
    dtype = DTYPE_NAMES.get(t.dtype)
    if dtype is None:  # described as raw bytes; DCP's metadata keeps the real dtype
        return Entry(name, nbytes, "U8", (nbytes,), tuple(saved_offsets))
    return Entry(name, nbytes, dtype, tuple(t.shape), tuple(saved_offsets))


def build_header(entries: list[Entry]) -> tuple[bytes, list[int]]:
    """(header bytes incl. the length prefix, absolute file offset of each entry's data).

    Data follows the header in entry order with no gaps, as safetensors requires.
    """
    meta: dict[str, str] = {"format": "pt", FORMAT_KEY: FORMAT_VERSION, "DCP_VERSION": "1.0"}
    sharding = {e.name: {"saved_offsets": list(e.saved_offsets)} for e in entries if not e.is_bytes}
    meta[SHARDING_KEY] = json.dumps(sharding, separators=(",", ":"))
    byte_names = [e.name for e in entries if e.is_bytes]
    if byte_names:
        meta[BYTE_ITEMS_KEY] = json.dumps(byte_names, separators=(",", ":"))
    header: dict[str, Any] = {"__metadata__": meta}
    rel = 0
    rel_starts = []
    for e in entries:
        if e.name in header:
            raise ValueError(f"duplicate entry name {e.name!r} in one shard file")
        shape = [e.nbytes] if e.is_bytes else list(e.shape)
        header[e.name] = {"dtype": e.dtype, "shape": shape, "data_offsets": [rel, rel + e.nbytes]}
        rel_starts.append(rel)
        rel += e.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-(HEADER_LEN_BYTES + len(body)) % 8)  # data starts 8-byte aligned
    prefix = struct.pack("<Q", len(body)) + body
    return prefix, [len(prefix) + r for r in rel_starts]
