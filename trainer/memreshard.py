"""Restore from the in-memory tier onto another world size: the keepers' snapshots as a
DCP checkpoint, so DCP reshards them exactly as it reshards a store checkpoint.

Why through DCP and not by hand: which bytes of which old shard a new rank needs
depends on FSDP/HSDP placements, uneven shards and replicated items; DCP's load planner
already works that out for store checkpoints (and is what every store resume on
another world size uses). A snapshot (trainer/memtier.py) holds what one rank's part of
a DCP save holds: its local shards (with each DTensor's global size and chunk offsets,
computed by DCP's own `_create_write_items` when the snapshot layout is built) and the
small items. So here:

* each old rank's snapshot head becomes that rank's DCP `SavePlan` (its write items);
* `DefaultSavePlanner.create_global_plan` merges them into the checkpoint `Metadata`
  and deduplicates replicated items (the trainer state every rank holds, plain tensors
  such as AdamW's `step`) to the lowest rank, as a store save does;
* `SnapshotReader` is a DCP `StorageReader` over the keepers: `dcp.load` plans the
  reads for the new rank's state dict against that metadata, and the reader fetches
  only the bytes of the boxes those reads need (ranged gets: one request per old rank,
  all old ranks at once), received straight into the target tensors where a box is one
  contiguous run (else its stored chunk is narrowed, as torch's file reader does).

The same shape as torch's `FileSystemReader.read_data`; what differs is where bytes
come from (keepers, by old rank) and that the small items are already in the heads.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import StorageReader
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import _create_write_items
from torch.distributed.tensor import DTensor
from torch.futures import Future

from trainer.shardfile import byte_view

# (old rank, [(offset, length), ...], [destination, ...]): receive those bytes of its
# snapshot into the destinations (writable views of the same sizes, in order); called from
# several threads at once, one old rank each
Fetch = Callable[[int, list[tuple[int, int]], list[memoryview]], None]


def chunk_of(key: str, value: DTensor) -> tuple[list[int], list[int]]:
    """A DTensor's local chunk as DCP saves it: (global offsets, global size)."""
    item = _create_write_items(key, value)[0]
    assert item.tensor_data is not None and item.tensor_data.chunk is not None
    return list(item.tensor_data.chunk.offsets), list(item.tensor_data.size)


def replica_share(value: DTensor) -> tuple[int, int]:
    """(this rank's index among the ranks holding the same local chunk of ``value``, how
    many hold it): the product of the mesh dimensions ``value`` is replicated over (HSDP's
    "replicate"), 1 when none."""
    mesh, coord = value.device_mesh, value.device_mesh.get_coordinate()
    index, count = 0, 1
    for dim, placement in enumerate(value.placements):
        if placement.is_replicate():
            assert coord is not None
            index, count = index * mesh.size(dim) + coord[dim], count * mesh.size(dim)
    return index, count


def replica_piece(local: torch.Tensor, index: int, count: int) -> tuple[torch.Tensor, int] | None:
    """The part of a replicated local chunk that replica ``index`` of ``count`` keeps in
    its snapshot, and its first row (dim 0) in the chunk; None: another replica keeps it.

    Why: with HSDP every replica group holds the same shards, and a snapshot of each in
    full sent to two keepers moved ``2 x replicas`` copies of the state per snapshot
    (one rank per node: the whole model per rank; at 58M parameters 0.7 GB per rank,
    more than a step's time to send on a 2-core host, so snapshots were skipped). Split
    by rows, the replicas together hold one copy, and each part has its buddy copy. A
    chunk with fewer rows than replicas is kept whole by replica 0."""
    if count <= 1:
        return local, 0
    if local.dim() == 0 or local.shape[0] < count:
        return (local, 0) if index == 0 else None
    rows = local.shape[0]
    start, end = rows * index // count, rows * (index + 1) // count
    return local[start:end], start


@dataclass(frozen=True)
class Head:
    """One old rank's snapshot head (trainer/memtier.py `encode`) and where its tensor
    bytes start in the payload."""

    rank: int
    tensors: list[tuple[str, str, list[int], int]]  # key, dtype, local shape, bytes
    small: dict[str, Any]
    chunks: dict[str, tuple[list[int], list[int]]]  # DTensor key -> (offsets, global size)
    data_start: int

    def spans(self) -> dict[str, tuple[int, int, str, list[int]]]:
        """key -> (payload offset, bytes, dtype, shape) of each tensor."""
        out, off = {}, self.data_start
        for key, dtype, shape, nbytes in self.tensors:
            out[key] = (off, nbytes, dtype, shape)
            off += nbytes
        return out


def save_plan(head: Head) -> SavePlan:
    """The write items a DCP save of this rank's state would have planned."""
    items: list[WriteItem] = []
    for key, dtype, shape, _ in head.tensors:
        offsets, size = head.chunks.get(key, ([0] * len(shape), list(shape)))
        sharded = key in head.chunks
        items.append(WriteItem(
            index=MetadataIndex(key, torch.Size(offsets)),
            type=WriteItemType.SHARD if sharded else WriteItemType.TENSOR,
            tensor_data=TensorWriteData(
                chunk=ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(shape)),
                properties=TensorProperties(dtype=getattr(torch, dtype)),
                size=torch.Size(size))))
    for key in head.small:
        if isinstance(head.small[key], torch.Tensor):  # a plain tensor: a full chunk
            items.extend(_create_write_items(key, head.small[key]))
        else:
            items.append(WriteItem(index=MetadataIndex(key), type=WriteItemType.BYTE_IO))
    return SavePlan(items, planner_data={})


def global_metadata(heads: list[Head]) -> Metadata:
    """The checkpoint metadata of all old ranks' snapshots (DCP's own global planning,
    replicated items kept on the lowest rank); `storage_data` maps each stored item to
    the old rank holding it."""
    planner = DefaultSavePlanner(dedup_save_to_lowest_rank=True)
    plans, metadata = planner.create_global_plan([save_plan(h) for h in heads])
    metadata.storage_data = {item.index: heads[i].rank
                             for i, plan in enumerate(plans) for item in plan.items}
    return metadata


class SnapshotReader(StorageReader):
    """A DCP StorageReader over the keepers' snapshots of one step (see the module
    docstring). Used with ``dcp.load(..., no_dist=True)``: ranks plan their reads alone
    and agree on the outcome afterwards, as the store path does.

    How the bytes travel (`read_data`): every old rank's snapshot is fetched at once, one
    request per old rank on a connection of its own (`fetch` may run concurrently), so no
    keeper waits for another's answer and a keeper serving two old ranks serves both in
    parallel. Only the bytes of the requested boxes travel, and they land straight in the
    target tensors when a box is one contiguous run in both the snapshot and the target
    (rows of a shard: every FSDP/HSDP reshard along dim 0), with no buffer in between
    and no copy after; any other box (a column slice) comes as its whole stored chunk
    into a scratch tensor and is narrowed and copied as DCP's file reader does."""

    def __init__(self, metadata: Metadata, heads: list[Head], fetch: Fetch,
                 parallel: int = 8) -> None:
        super().__init__()
        self.metadata = metadata
        self.heads = {h.rank: h for h in heads}
        self.fetch = fetch
        self.parallel = max(1, parallel)
        self.read_from: set[int] = set()  # old ranks whose bytes this rank read
        self.bytes_read = 0
        self.direct_bytes = 0  # of those, received straight into the target tensors

    def reset(self, checkpoint_id: Any = None) -> None:
        """Nothing to reset: one reader per restore."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        by_rank: dict[int, list[ReadItem]] = {}
        for item in plan.items:
            by_rank.setdefault(self.metadata.storage_data[item.storage_index], []).append(item)
        reads: list[_RankRead] = []
        for rank, items in sorted(by_rank.items()):
            head = self.heads[rank]
            tensor_items = [i for i in items if i.type != LoadItemType.BYTE_IO]
            for item in items:
                if item.type == LoadItemType.BYTE_IO:
                    buf = io.BytesIO()
                    torch.save(head.small[item.storage_index.fqn], buf)
                    buf.seek(0)
                    planner.load_bytes(item, buf)
            plain = [i for i in tensor_items if i.storage_index.fqn in head.small]
            for item in plain:  # small plain tensors travelled in the head
                self._copy(planner, item, head.small[item.storage_index.fqn])
            stored = [i for i in tensor_items if i.storage_index.fqn not in head.small]
            if stored:
                reads.append(_plan_rank_read(rank, head, stored, planner))
        todo = [r for r in reads if r.ranges]
        for r in reads:
            self.bytes_read += sum(n for _, n in r.ranges)
            self.direct_bytes += sum(d.nbytes for d, (_, t) in zip(r.dests, r.direct, strict=True)
                                     if t is not None)
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.parallel, len(todo)),
                                    thread_name_prefix="cb-memread") as pool:
                futures = {pool.submit(self.fetch, r.rank, r.ranges, r.dests): r for r in todo}
                for fut in as_completed(futures):
                    fut.result()  # the first failure fails the restore (the store it is)
                    self.read_from.add(futures[fut].rank)
        for r in reads:  # every byte is in place: commit, narrowing the scratch chunks
            for item, target in r.direct:
                if target is not None:
                    planner.commit_tensor(item, target)
            for item, chunk in r.scratch_items:
                self._copy(planner, item, chunk)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def _copy(planner: LoadPlanner, item: ReadItem, stored: torch.Tensor) -> None:
        part = narrow_tensor_by_index(stored, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != part.size():
            raise RuntimeError(f"{item.storage_index.fqn}: stored part {tuple(part.size())} "
                               f"!= target {tuple(target.size())}")
        target.copy_(part)
        planner.commit_tensor(item, target)


@dataclass
class _RankRead:
    """One old rank's part of a restore: the byte ranges of its snapshot to fetch and
    where each lands, then what to commit (items received in place) and to copy (items
    narrowed out of a scratch chunk)."""

    rank: int
    ranges: list[tuple[int, int]]
    dests: list[memoryview]
    direct: list[tuple[ReadItem, torch.Tensor | None]]  # per range; None: a scratch chunk
    scratch_items: list[tuple[ReadItem, torch.Tensor]]


def box_span(shape: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]
             ) -> tuple[int, int] | None:
    """(first element, elements) of the box ``offsets``/``lengths`` in a row-major tensor
    of ``shape`` when the box is one contiguous run (leading dims of length 1, then one
    dim of any length, then full dims); None when it is not (e.g. a column slice)."""
    dims = len(shape)
    k = next((i for i in range(dims) if lengths[i] != 1), dims - 1)
    if any(lengths[i] != shape[i] for i in range(k + 1, dims)):
        return None
    stride, first = 1, 0
    for i in reversed(range(dims)):
        first += offsets[i] * stride
        stride *= shape[i]
    count = 1
    for n in lengths:
        count *= n
    return first, count


def _plan_rank_read(rank: int, head: Head, items: list[ReadItem],
                    planner: LoadPlanner) -> _RankRead:
    """Where each of ``items`` (tensor items stored in ``rank``'s snapshot) comes from and
    lands (see `SnapshotReader`)."""
    spans = head.spans()
    read = _RankRead(rank, [], [], [], [])
    scratch: dict[str, torch.Tensor] = {}
    for item in items:
        fqn = item.storage_index.fqn
        off, nbytes, dtype_name, shape = spans[fqn]
        dtype = getattr(torch, dtype_name)
        target = planner.resolve_tensor(item).detach()
        span = box_span(shape, item.storage_offsets, item.lengths)
        if (span is not None and target.device.type == "cpu" and target.dtype == dtype
                and target.is_contiguous() and list(target.size()) == list(item.lengths)):
            first, count = span
            size = count * dtype.itemsize
            if size == 0:
                planner.commit_tensor(item, target)
                continue
            read.ranges.append((off + first * dtype.itemsize, size))
            read.dests.append(byte_view(target))
            read.direct.append((item, target))
            continue
        chunk = scratch.get(fqn)
        if chunk is None:  # the whole stored chunk, once however many items narrow it
            chunk = scratch[fqn] = torch.empty(shape, dtype=dtype)
            if nbytes:
                read.ranges.append((off, nbytes))
                read.dests.append(byte_view(chunk))
                read.direct.append((item, None))
        read.scratch_items.append((item, chunk))
    return read
