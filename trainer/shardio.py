"""Moving checkpoint bytes between tensors and a store: the data path of our DCP
StorageWriter / StorageReader (trainer/storage.py binds it to a local directory or S3).

Save (`ShardWriterMixin.write_data`): DCP hands each rank a plan of WriteItems. They are
grouped into files: every small item (pickled objects, tensors under SMALL_ITEM_BYTES)
in a file of their own, big tensors balanced over `thread_count` files. Why the small
file: DCP deduplicates replicated values (AdamW's `step` scalars, the RNG state) onto
whichever rank has the least to write, so every rank reads a few of them back from other
ranks' files; with them in big files, each rank downloaded and hashed the other ranks'
whole shards just for a handful of scalars. Each file is laid out as a safetensors file
(trainer/shardfile.py) and written straight from the tensors' memory; its xxh3-128 is
computed on the way and travels to the coordinator with DCP's write results, for the
manifest.

Load (`ShardReaderMixin.read_data`): for each file this rank needs, the byte range of
every item it reads is known from DCP's `.metadata` before any I/O, so one sequential
read of the file (a local read, or one streamed GET) lands each range directly in its
destination: the live parameter or optimizer tensor when that is contiguous, on the CPU
and of the saved dtype (the common case, resharded or not: FSDP shards along dim 0, so
a resharded piece is still one contiguous range), a scratch tensor otherwise (copied
after the file is verified). Every byte of the file is hashed as it arrives, and size
and hash are checked against the manifest when the file ends. Files are fetched
concurrently (READ_THREADS per rank).

A failed verification raises after some live tensors may already hold the file's bytes:
the trainer exits 2 on it, so they are never trained on.

Over 400 lines on purpose: it is one data path (file plan, encoding, hashing, landing
bytes in tensors, verification) for save and load, both bound to the same file layout.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from checkpoint_layout import TransientError, expected_digest, new_hasher
from trainer.errors import TrainerError
from trainer.shardfile import RAW_DESCRIPTOR, Entry, build_header, byte_view, tensor_entry

CHUNK = 8 << 20  # bytes per read/write call: large enough for few syscalls, hashed while cache-hot
SMALL_ITEM_BYTES = 1 << 20
READ_THREADS = 8  # files fetched concurrently per rank on load
_DATA_SUFFIX = ".distcp"


class ChecksumError(TrainerError):
    """A checkpoint file whose size or digest differs from its manifest entry."""


class TruncatedRead(ChecksumError, TransientError):
    """A file's bytes ended before the size its store announced: on S3 a cut stream,
    which the S3 reader retries; locally a file that shrank while being read."""


def verify(
    where: str, name: str, entry: dict[str, Any] | None, size: int, digest: str | None
) -> None:
    if not entry:
        return
    if entry.get("size") is not None and int(entry["size"]) != size:
        raise ChecksumError(
            f"checkpoint {where} is corrupt: file {name} has {size} bytes, "
            f"the manifest says {entry['size']}"
        )
    want = expected_digest(entry)
    if want and digest != want[1]:
        raise ChecksumError(
            f"checkpoint {where} is corrupt: file {name} has {want[0]} {digest}, "
            f"the manifest says {want[1]}"
        )


# =========================================================================== save
def _item_nbytes(item: WriteItem) -> int:
    if item.tensor_data is None:
        return 0
    return math.prod(item.tensor_data.size) * torch._utils._element_size(
        item.tensor_data.properties.dtype
    )


def plan_files(prefix: str, items: list[WriteItem], bins: int) -> list[tuple[str, list[WriteItem]]]:
    """[(file name, items)]: file 0 holds the small items, files 1..bins the big tensors
    (largest first onto the least-loaded file). Empty files are left out."""
    small = [
        i for i in items if i.type == WriteItemType.BYTE_IO or _item_nbytes(i) < SMALL_ITEM_BYTES
    ]
    small_ids = {id(i) for i in small}
    big = sorted((i for i in items if id(i) not in small_ids), key=_item_nbytes, reverse=True)
    buckets: list[list[WriteItem]] = [[] for _ in range(max(1, bins))]
    loads = [0] * len(buckets)
    for item in big:
        k = loads.index(min(loads))
        buckets[k].append(item)
        loads[k] += _item_nbytes(item)
    files = [(f"{prefix}0{_DATA_SUFFIX}", small)]
    files += [(f"{prefix}{k + 1}{_DATA_SUFFIX}", b) for k, b in enumerate(buckets)]
    return [(name, its) for name, its in files if its]


@dataclass
class EncodedFile:
    """A shard file as a list of byte segments (header, then each item's bytes)."""

    segments: list[memoryview]
    placements: list[tuple[WriteItem, int, int]]  # (item, offset in file, length)

    @property
    def size(self) -> int:
        return sum(len(s) for s in self.segments)


def encode_file(items: list[WriteItem], planner: SavePlanner) -> EncodedFile:
    """Resolve each item's data and lay the file out; tensors are referenced, not copied."""
    entries: list[Entry] = []
    datas: list[memoryview] = []
    keep: list[Any] = []  # objects whose memory the views point into
    seen: set[str] = set()
    for item in items:
        data = planner.resolve_data(item)
        name = item.index.fqn
        if name in seen:  # several chunks of one tensor on this rank (old ShardedTensor)
            name = f"{name}@{','.join(map(str, item.index.offset or ()))}"
        seen.add(name)
        if item.type == WriteItemType.BYTE_IO:
            if not isinstance(data, io.BytesIO):
                raise TypeError(f"{item.index.fqn}: BYTE_IO item resolved to {type(data)}")
            view = data.getbuffer()
            keep.append(data)
            entries.append(Entry(name, len(view), is_bytes=True))
            datas.append(view)
            continue
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"{item.index.fqn}: tensor item resolved to {type(data)}")
        t = data.detach()
        if t.device.type != "cpu":  # sync save on GPU: one copy to host, as DCP's own writer
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        keep.append(t)
        assert item.tensor_data is not None
        entries.append(tensor_entry(name, t, tuple(item.tensor_data.chunk.offsets)))
        datas.append(byte_view(t))
    header, offsets = build_header(entries)
    placements = [(item, off, len(d)) for item, off, d in zip(items, offsets, datas, strict=True)]
    enc = EncodedFile([memoryview(header), *datas], placements)
    enc._keep = keep  # type: ignore[attr-defined]
    return enc


def chunks_of(segments: list[memoryview]) -> Iterator[memoryview]:
    for seg in segments:
        for i in range(0, len(seg), CHUNK):
            yield seg[i : i + CHUNK]


def write_local(path: str, segments: list[memoryview], hasher: Any, fsync: bool = True) -> None:
    """Write the segments to `path` (8 MiB writes, each hashed right after it), then fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in chunks_of(segments):
            done = 0
            while done < len(chunk):
                done += os.write(fd, chunk[done:])
            hasher.update(chunk)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class HashedInfo:
    """A WriteResult's storage info plus its file's digest, on its way to the coordinator.

    Why: each rank hashes only its own files, but rank 0 writes the manifest. DCP
    already gathers every rank's WriteResults to the coordinator for `.metadata`; the
    digest rides along and `finish` strips it again, so `.metadata` stays plain DCP.
    """

    info: Any
    digest: str | None


class ShardWriterMixin:
    """DCP StorageWriter data path; the class it is mixed into provides `_write_file`.

    After `finish` on the coordinator, `file_hashes` = {file name: xxh3-128 hex} of every
    file of the checkpoint (all ranks' shards and `.metadata`).
    """

    thread_count: int
    fs: Any
    file_hashes: dict[str, str]

    def _write_file(self, name: str, enc: EncodedFile, hasher: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture:
        files = plan_files(plan.storage_data.prefix, plan.items, self.thread_count)

        def one(name: str, items: list[WriteItem]) -> list[WriteResult]:
            enc = encode_file(items, planner)
            hasher = new_hasher()
            self._write_file(name, enc, hasher)
            digest = hasher.hexdigest()
            return [
                WriteResult(
                    index=item.index,
                    size_in_bytes=length,
                    storage_data=HashedInfo(
                        _StorageInfo(name, off, length, [RAW_DESCRIPTOR]), digest
                    ),
                )
                for item, off, length in enc.placements
            ]

        results: list[WriteResult] = []
        if files:
            with ThreadPoolExecutor(min(len(files), max(1, self.thread_count))) as pool:
                futs = [pool.submit(one, name, items) for name, items in files]
                for f in futs:
                    results += f.result()
        fut: TorchFuture = TorchFuture()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        file_hashes: dict[str, str] = {}
        plain: list[list[WriteResult]] = []
        for wr_list in results:
            row = []
            for wr in wr_list:
                sd = wr.storage_data
                if isinstance(sd, HashedInfo):
                    if sd.digest:
                        file_hashes[sd.info.relative_path] = sd.digest
                    sd = sd.info
                row.append(
                    WriteResult(index=wr.index, size_in_bytes=wr.size_in_bytes, storage_data=sd)
                )
            plain.append(row)
        super().finish(metadata, plain)  # type: ignore[misc]  # writes .metadata through self.fs
        for name, (digest, _size) in self.fs.hashes.items():
            if name.endswith(".metadata"):
                file_hashes[name] = digest
        self.file_hashes = file_hashes


# =========================================================================== load
@dataclass
class _Landing:
    """Where one byte range of a file lands while the file streams by."""

    offset: int
    view: memoryview


@dataclass
class _FilePlan:
    landings: list[_Landing] = field(default_factory=list)
    after: list[Callable[[], None]] = field(default_factory=list)  # once the file is verified


def contiguous_range(
    sizes: list[int], offsets: list[int], lengths: list[int]
) -> tuple[int, int] | None:
    """(first element, count) if the box (offsets, lengths) of a row-major array of `sizes`
    is one contiguous run of elements, else None: leading dims of length 1, then one dim
    of any length, then only whole dims (FSDP's dim-0 shards and their reshards)."""
    n = len(sizes)
    k = 0
    while k < n and lengths[k] == 1:
        k += 1
    if any(offsets[j] != 0 or lengths[j] != sizes[j] for j in range(k + 1, n)):
        return None
    start = 0
    for j in range(n):
        start = start * sizes[j] + offsets[j]
    return start, math.prod(lengths)


def _chunk_sizes(md: TensorStorageMetadata, index: MetadataIndex) -> list[int]:
    chunks = md.chunks
    if index.index is not None and index.index < len(chunks):
        c = chunks[index.index]
        if index.offset is None or list(c.offsets) == list(index.offset):
            return list(c.sizes)
    for c in chunks:
        if index.offset is not None and list(c.offsets) == list(index.offset):
            return list(c.sizes)
    raise KeyError(f"no chunk at {index.offset} for {index.fqn}")


class ShardReaderMixin:
    """DCP StorageReader data path; the class it is mixed into provides `_open`.

    `_open(name)` is a context manager yielding (readinto, size) for one whole file.
    Items written by older versions (torch.save per item, no RAW_DESCRIPTOR) are still
    read: their bytes land in a scratch buffer and are decoded with torch.load.
    """

    storage_data: dict[Any, Any]
    transforms: Any
    expected: dict[str, dict[str, Any]]
    where: str
    _metadata: Metadata | None = None

    def _open(self, name: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _retry(self, fn: Callable[[], None]) -> None:
        fn()

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *a: Any, **kw: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *a, **kw)  # type: ignore[misc]
        self._metadata = metadata

    # ------------------------------------------------------------- one whole file
    def _read_file(self, name: str, landings: Callable[[int], list[_Landing]]) -> None:
        """Stream file `name` once, landing byte ranges where `landings(size)` says, and
        verify its size and digest against the manifest entry (whole file, retried)."""
        entry = self.expected.get(name)
        want = expected_digest(entry)

        def attempt() -> None:
            with self._open(name) as (readinto, size):
                if entry and entry.get("size") is not None and int(entry["size"]) != size:
                    verify(self.where, name, entry, size, None)  # wrong size: fail before reading
                hasher = new_hasher(want[0]) if want else None
                _stream(readinto, size, landings(size), hasher, name, self.where)
                verify(self.where, name, entry, size, hasher.hexdigest() if hasher else None)

        self._retry(attempt)

    def read_whole(self, name: str) -> bytearray:
        """A whole (small) file, verified: `.metadata`."""
        out: list[bytearray] = []

        def whole(size: int) -> list[_Landing]:
            out[:] = [bytearray(size)]  # a retry starts over with a fresh buffer
            return [_Landing(0, memoryview(out[0]))]

        self._read_file(name, whole)
        return out[0]

    # ------------------------------------------------------------------- planning
    def _plan(
        self, plan: LoadPlan, planner: LoadPlanner
    ) -> tuple[dict[str, _FilePlan], list[tuple[ReadItem, torch.Tensor]]]:
        by_item: dict[Any, list[ReadItem]] = {}
        for req in plan.items:
            by_item.setdefault(req.storage_index, []).append(req)
        files: dict[str, _FilePlan] = {}
        commits: list[tuple[ReadItem, torch.Tensor]] = []
        for sidx, reqs in by_item.items():
            info: _StorageInfo = self.storage_data[sidx]
            fp = files.setdefault(info.relative_path, _FilePlan())
            descriptors = list(info.transform_descriptors or ())
            if descriptors not in ([], [RAW_DESCRIPTOR]):  # e.g. compressed by a DCP extension
                self._plan_legacy(fp, info, reqs, planner)
            elif reqs[0].type == LoadItemType.BYTE_IO:
                self._plan_bytes(fp, info, reqs, planner)
            elif not descriptors:  # torch.save'd tensor: written before the raw layout
                self._plan_legacy(fp, info, reqs, planner)
            else:
                self._plan_tensor(fp, sidx, info, reqs, planner, commits)
        return files, commits

    def _plan_bytes(
        self, fp: _FilePlan, info: _StorageInfo, reqs: list[ReadItem], planner: LoadPlanner
    ) -> None:
        """Pickled objects are stored as plain bytes, in both layouts."""
        buf = bytearray(info.length)
        fp.landings.append(_Landing(info.offset, memoryview(buf)))
        fp.after.extend(lambda r=r: planner.load_bytes(r, io.BytesIO(buf)) for r in reqs)

    def _plan_tensor(
        self,
        fp: _FilePlan,
        sidx: MetadataIndex,
        info: _StorageInfo,
        reqs: list[ReadItem],
        planner: LoadPlanner,
        commits: list[tuple[ReadItem, torch.Tensor]],
    ) -> None:
        assert self._metadata is not None
        md = self._metadata.state_dict_metadata.get(sidx.fqn)
        if not isinstance(md, TensorStorageMetadata):
            raise TrainerError(
                f"checkpoint {self.where} is corrupt: .metadata has no tensor {sidx.fqn}"
            )
        dtype = md.properties.dtype
        try:
            sizes = _chunk_sizes(md, sidx)
        except KeyError as exc:
            raise TrainerError(f"checkpoint {self.where} is corrupt: .metadata {exc}") from None
        esize = torch._utils._element_size(dtype)
        if math.prod(sizes) * esize != info.length:
            raise TrainerError(
                f"checkpoint {self.where} is corrupt: {sidx.fqn} chunk {sizes} of {dtype} "
                f"does not fill its {info.length} stored bytes"
            )
        if len(reqs) == 1:
            req = reqs[0]
            rng = contiguous_range(sizes, list(req.storage_offsets), list(req.lengths))
            if rng is not None:
                dst = planner.resolve_tensor(req).detach()
                start, nbytes = info.offset + rng[0] * esize, rng[1] * esize
                if dst.dtype == dtype and dst.device.type == "cpu" and dst.is_contiguous():
                    if nbytes:
                        fp.landings.append(_Landing(start, byte_view(dst)))  # straight in
                else:  # other dtype, device or layout: via scratch, converted by copy_
                    scratch = torch.empty(nbytes, dtype=torch.uint8)
                    fp.landings.append(_Landing(start, byte_view(scratch)))
                    shape = list(req.lengths)
                    fp.after.append(
                        lambda d=dst, s=scratch, sh=shape: d.copy_(s.view(dtype).view(sh))
                    )
                commits.append((req, dst))
                return
        # several boxes of one chunk, or a box that is not one contiguous run: whole chunk
        scratch = torch.empty(info.length, dtype=torch.uint8)
        fp.landings.append(_Landing(info.offset, byte_view(scratch)))
        for req in reqs:
            dst = planner.resolve_tensor(req).detach()

            def place(d: torch.Tensor = dst, r: ReadItem = req) -> None:
                src = scratch.view(dtype).view(sizes)
                d.copy_(narrow_tensor_by_index(src, r.storage_offsets, r.lengths))

            fp.after.append(place)
            commits.append((req, dst))

    def _plan_legacy(
        self,
        fp: _FilePlan,
        info: _StorageInfo,
        reqs: list[ReadItem],
        planner: LoadPlanner,
    ) -> None:
        """An item to decode with DCP's transforms and torch.load, as DCP's own reader does."""
        buf = bytearray(info.length)
        fp.landings.append(_Landing(info.offset, memoryview(buf)))

        def decode() -> None:
            for req in reqs:
                stream = self.transforms.transform_load_stream(
                    req, info.transform_descriptors or (), io.BytesIO(buf)
                )
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, io.BytesIO(stream.read()))
                    continue
                tensor = torch.load(stream, map_location="cpu", weights_only=True)
                tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
                dst = planner.resolve_tensor(req).detach()
                if dst.size() != tensor.size():
                    raise TrainerError(
                        f"checkpoint {self.where} is corrupt: {req.storage_index.fqn} has shape "
                        f"{tuple(tensor.size())}, expected {tuple(dst.size())}"
                    )
                dst.copy_(tensor)
                planner.commit_tensor(req, dst)

        fp.after.append(decode)

    # -------------------------------------------------------------------- reading
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        metadata = pickle.loads(self.read_whole(name))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # type: ignore[attr-defined]
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture:
        files, commits = self._plan(plan, planner)
        if files:
            with ThreadPoolExecutor(min(READ_THREADS, len(files)), "cb-ckpt-read") as pool:
                futs = [pool.submit(self._fetch, name, fp) for name, fp in files.items()]
                wait(futs, return_when=FIRST_EXCEPTION)
                for f in futs:  # after a failure, files not yet started are not fetched
                    f.cancel()
                for f in futs:
                    if not f.cancelled():
                        f.result()
            for fp in files.values():
                for fn in fp.after:
                    fn()
        for req, dst in commits:
            planner.commit_tensor(req, dst)
        fut: TorchFuture = TorchFuture()
        fut.set_result(None)
        return fut

    def _fetch(self, name: str, fp: _FilePlan) -> None:
        landings = sorted(fp.landings, key=lambda x: x.offset)
        self._read_file(name, lambda _size: landings)


_skip_local = threading.local()


def _skip_buffer() -> memoryview:
    buf = getattr(_skip_local, "buf", None)
    if buf is None:
        buf = _skip_local.buf = memoryview(bytearray(CHUNK))
    return buf


def _stream(
    readinto: Callable[[memoryview], int],
    size: int,
    landings: list[_Landing],
    hasher: Any,
    name: str,
    where: str = "",
) -> None:
    """Read a whole file of `size` bytes in order: each landing's range into its view,
    everything else into a small reused buffer; every byte goes through `hasher`."""
    pos = 0

    def fill(view: memoryview) -> None:
        nonlocal pos
        got = 0
        while got < len(view):
            n = readinto(view[got : got + CHUNK])
            if not n:
                raise TruncatedRead(
                    f"checkpoint {where} is corrupt: file {name} ended after {pos + got} bytes"
                )
            if hasher is not None:
                hasher.update(view[got : got + n])
            got += n
        pos += got

    def skip_to(off: int) -> None:
        skip = _skip_buffer()
        while pos < off:
            fill(skip[: min(len(skip), off - pos)])

    for landing in landings:
        if landing.offset < pos or landing.offset + len(landing.view) > size:
            raise TrainerError(
                f"checkpoint {where} is corrupt: .metadata places bytes {landing.offset}.."
                f"{landing.offset + len(landing.view)} of {name} outside the file or overlapping"
            )
        skip_to(landing.offset)
        fill(landing.view)
    skip_to(size)
