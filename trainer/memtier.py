"""The in-memory recovery tier, rank side: snapshot this rank's shard every K steps into
its node's keeper and its buddy node's keeper; restore from them on a same-size restart.

Why (docs/recovery.md): the store tier loses every step since the last periodic
checkpoint and re-reads the whole checkpoint. Here every `K` steps each rank takes the
small state (step, scheduler, data position, every RNG, optimizer hyperparameters) on the
training thread and copies its own shard (FSDP local shards, not a full state dict) into
host buffers allocated once on the tier's thread, overlapping the next forward and
backward: an optimizer step pre-hook fences it, so no update races the copy. The same
thread then sends the buffers' bytes, unjoined, to two keepers (trainer/memkeeper.py):
its own node's and the next node's (a ring over nodes). A node
lost with its keeper leaves every shard it held on the buddy. Sending goes over plain
TCP, never a collective, so it cannot interleave with FSDP's gloo/NCCL traffic.
Parameters changed outside `optimizer.step()` between two steps would race the copy:
nothing in the library does that; a script that does should not use the tier.

Which steps: every rank takes or skips a snapshot alike (skipped while any rank's
previous one is still sending, agreed in the per-step flags all-reduce, `maybe_snapshot`),
so the keepers hold the same steps of every rank and one complete set is always there
while the next is in flight. A model replicated over ranks (HSDP, e.g. one rank per
node) has each replica keep only its rows of the shard it shares with the others
(`memreshard.replica_piece`): the replicas together send one copy, not one each.

Restore: ranks ask every keeper (keepers hold shards by rank, so any node order works)
which steps of which old ranks they hold, and agree on the newest step whose every old
rank's shard some keeper holds. On the same world size (replace in place: survivors
plus a spare in the lost node's place) each rank reads its own old shard straight into
its live tensors. On another world size (shrink in place: the survivors only), or when
the snapshots are replicas' parts, they are read as a DCP checkpoint and DCP reshards
them (trainer/memreshard.py), exactly as a store resume reshards N -> M; every old
rank's snapshot is read at once on a connection of its own, and only the rows this rank
needs travel, received straight into the live tensors. Either way `resume_tier:
memory`. A shard with both copies gone, a keeper unreachable or any failure on any
rank: the store. Where a restore's time went is in `restore_s` (and the progress file's
`memory_restore_s`, and one log line).

Uses torch's private DCP helpers `flatten_state_dict` / `set_element` (as DCP itself
does) so a snapshot's keys are exactly the store's. Configured by the launcher
(docs/recovery.md): `CB_MEMORY_EVERY` (K, 0 = off),
`CB_MEMORY_KEEPERS` (comma-separated `host:port` of each node's keeper, in node-rank
order; the node is `NODE_RANK` (`GROUP_RANK`)), `CB_MEMORY_TOKEN` (the keepers' token).
Where the launcher cannot know which node a node rank lands on (a Kubernetes indexed Job:
the scheduler picks which placed node runs which index), it names the keepers instead,
`node=host:port` in ring order, and the rank finds its own by its node's name in
`CB_NODE_ID`; the buddy is the next entry either way.
"""

from __future__ import annotations

import copy
import io
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.tensor import DTensor

from trainer import memreshard, rng
from trainer.memkeeper import (
    TOKEN_ENV,
    Payload,
    recv_header,
    recv_msg,
    recv_payload,
    recv_payload_into,
    send_msg,
)
from trainer.shardfile import byte_view

if TYPE_CHECKING:
    from trainer.checkpoint import CheckpointManager
    from trainer.run import Run

EVERY_ENV = "CB_MEMORY_EVERY"
KEEPERS_ENV = "CB_MEMORY_KEEPERS"
NODE_ID_ENV = "CB_NODE_ID"  # the node's name, as the launcher names keepers
CONNECT_TIMEOUT_S = 5.0
# A request's socket timeout: a base plus the payload at a floor rate. Why not a fixed
# 60 s: Python's sendall counts its timeout over the whole send, and one rank's
# snapshot of the 200m model is 1-3 GB; on a loaded host (the keeper's receive competing
# with training for the cores) that send can take more than a minute without anything
# being wrong, and a timeout would drop that snapshot and reconnect.
IO_TIMEOUT_S = 60.0
IO_MIN_BYTES_PER_S = 8 << 20


def io_timeout(nbytes: int) -> float:
    """Seconds a request moving ``nbytes`` may take before the keeper counts as gone."""
    return IO_TIMEOUT_S + nbytes / IO_MIN_BYTES_PER_S
# Below this many shard bytes the copy stays on the training thread: a few MB copy in a
# millisecond or two, while handing them to the tier's thread costs more (GIL hand-offs
# over hundreds of small tensors; measured by benchmarks/bench_memtier.py on the small
# model: 6-12 ms a snapshot on the side against ~2 ms in place).
OVERLAP_MIN_BYTES = 64 << 20


def parse_keepers(entries: list[str]) -> tuple[list[str], list[str]]:
    """``CB_MEMORY_KEEPERS`` entries -> (node names, or [] when unnamed; addresses).
    Either every entry is named (``node=host:port``) or none is."""
    named = ["=" in e for e in entries]
    if any(named) and not all(named):
        raise ValueError(f"{KEEPERS_ENV}: either every keeper is named (node=host:port) or none")
    if not any(named):
        return [], list(entries)
    pairs = [e.split("=", 1) for e in entries]
    return [n for n, _ in pairs], [a for _, a in pairs]


class KeeperClient:
    """One persistent connection to a keeper; reconnects once per request on error."""

    def __init__(self, address: str, token: str) -> None:
        host, _, port = address.rpartition(":")
        self.address, self._addr, self.token = address, (host, int(port)), token
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _exchange(self, size: int, talk: Callable[[socket.socket], Any],
                  out_of_step: tuple[type[Exception], ...] = (OSError,)) -> Any:
        """``talk`` over this keeper's connection (made on first use), retried once on a
        fresh connection: a keeper's idle connection may have been dropped, and after an
        error the stream may be out of step (``out_of_step``), so it is never reused."""
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        self._sock = socket.create_connection(self._addr, timeout=CONNECT_TIMEOUT_S)
                    self._sock.settimeout(io_timeout(size))
                    return talk(self._sock)
                except out_of_step:
                    if self._sock is not None:
                        self._sock.close()
                    self._sock = None
                    if attempt:
                        raise
        raise AssertionError("unreachable")

    def request(self, header: dict[str, Any], payload: Payload | Sequence[Payload] = b""
                ) -> tuple[dict[str, Any], bytearray]:
        segments = [payload] if isinstance(payload, bytes | bytearray | memoryview) else payload
        size = sum(memoryview(seg).nbytes for seg in segments)

        def talk(sock: socket.socket) -> tuple[dict[str, Any], bytearray]:
            send_msg(sock, {**header, "token": self.token}, segments)
            return recv_msg(sock)
        return self._exchange(size, talk)

    def request_into(self, header: dict[str, Any], dests: Sequence[memoryview]) -> dict[str, Any]:
        """A request whose reply's payload is received straight into ``dests`` (writable
        views, back to back: a ranged get's ranges in order); the reply's header. A reply
        without the payload (``ok`` false) raises RuntimeError with the keeper's error."""

        def talk(sock: socket.socket) -> dict[str, Any]:
            send_msg(sock, {**header, "token": self.token})
            reply = recv_header(sock)
            if not reply.get("ok"):
                recv_payload(sock, reply)  # none, normally: keep the stream whole
                raise RuntimeError(str(reply.get("error", "no payload")))
            recv_payload_into(sock, reply, dests)
            return reply
        # ValueError: a payload of another size; the stream is out of step
        return self._exchange(sum(d.nbytes for d in dests), talk, (OSError, ValueError))

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
            self._sock = None


MAGIC = b"CBMT\x01\x00\x00\x00"  # snapshot format 1: magic, head length, head, tensor bytes


@dataclass
class Layout:
    """What a snapshot copies (see `MemoryTier._current_layout`): the live local tensors
    by flattened key, the constant non-tensor items, and the optimizer hyperparameters
    read afresh each time (key -> (param group, name))."""

    fingerprint: tuple[int, ...] | None
    tensors: list[tuple[str, torch.Tensor]]
    const: dict[str, Any]
    live: dict[str, tuple[int, str]]
    # DTensor key -> (global offsets, global size) of this rank's chunk: what a restore
    # on another world size needs to reshard (trainer/memreshard.py)
    chunks: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for _, t in self.tensors)


def encode(step: int, world_size: int, small: dict[str, Any],
           tensors: list[tuple[str, torch.Tensor]],
           chunks: dict[str, tuple[list[int], list[int]]] | None = None) -> list[memoryview]:
    """A snapshot as segments sent back to back: the magic, a torch.save'd head (step,
    world size, the small items, each tensor's key, dtype, shape and size, each sharded
    tensor's global offsets and size), then every
    tensor's raw bytes straight from its buffer. Why not torch.save of everything: it
    copies every byte into a growing buffer and once more out of it (measured: the
    rank's background CPU per snapshot), and the keeper stores the payload as is."""
    head_buf = io.BytesIO()
    torch.save({"step": step, "world_size": world_size, "small": small,
                "tensors": [(k, str(t.dtype).removeprefix("torch."), list(t.shape), t.nbytes)
                            for k, t in tensors], "chunks": dict(chunks or {})}, head_buf)
    head = head_buf.getvalue()
    return [memoryview(MAGIC + struct.pack(">Q", len(head)) + head),
            *(byte_view(t) for _, t in tensors)]


PREFIX = len(MAGIC) + 8  # the magic and the head's length


def head_length(prefix: Payload) -> int:
    """The head's length from a snapshot's first `PREFIX` bytes."""
    mv = memoryview(prefix)
    if bytes(mv[:len(MAGIC)]) != MAGIC:
        raise RuntimeError("not a snapshot of this format")
    return struct.unpack(">Q", mv[len(MAGIC):PREFIX])[0]


def load_head(raw: Payload) -> dict[str, Any]:
    return torch.load(io.BytesIO(memoryview(raw)), weights_only=False)


def decode(payload: bytearray) -> dict[str, Any]:
    """`encode`'s segments back as {"step", "world_size", "state": key -> value}; the
    tensors are views of `payload` (no copy: they are copied once, into the live ones)."""
    mv = memoryview(payload)
    n = head_length(mv[:PREFIX])
    off = PREFIX
    head = load_head(mv[off:off + n])
    off += n
    state = dict(head["small"])
    for key, dtype, shape, nbytes in head["tensors"]:
        raw = (torch.frombuffer(mv[off:off + nbytes], dtype=torch.uint8) if nbytes
               else torch.empty(0, dtype=torch.uint8))
        state[key] = raw.view(getattr(torch, dtype)).reshape(shape)
        off += nbytes
    if off != len(mv):
        raise RuntimeError(f"snapshot is {len(mv)} bytes, its head describes {off}")
    return {"step": head["step"], "world_size": head["world_size"], "state": state}


RANGES_PER_GET = 1000  # byte ranges per keeper request (its header size is bounded)
READ_PARALLEL = 8  # old ranks' snapshots a restoring rank reads at once (a connection each)


class _Laps:
    """Seconds since the previous lap, by name (where a restore's time went)."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into, self.t = into, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = round(self.into.get(name, 0.0) + now - self.t, 3)
        self.t = now


def newest_complete(views: list[set[tuple[int, int, int]]], min_step: int
                    ) -> tuple[int, int] | None:
    """(step, world size) of the newest step >= `min_step` that every restoring rank sees
    for every old rank 0..W-1 of one world size W; `views` are the ranks' sets of
    (old rank, step, world size) the keepers hold. None: nothing complete (a shard with
    both copies gone), the store it is."""
    common = set.intersection(*views) if views else set()
    complete = {(s, w) for _, s, w in common
                if s >= min_step and all((q, s, w) in common for q in range(w))}
    return max(complete) if complete else None


@dataclass(frozen=True)
class Restored:
    """What a restore from memory did: the step, the world size it was saved on, and the
    (new) ranks that read any of it from another node's keeper."""

    step: int
    saved_world: int
    from_peer: list[int]


@dataclass
class SnapshotStats:
    """What the tier reports (logged at the end, and per snapshot size once)."""

    taken: int = 0
    skipped: int = 0  # the previous one was still sending
    failed: int = 0
    bytes: int = 0  # one snapshot of this rank, serialized
    copy_s: float = 0.0  # total time on the training thread in maybe_snapshot
    fence_s: float = 0.0  # total time the training thread waited for the side copy
    side_copy_s: float = 0.0  # total time of the shard copies on the tier's thread
    send_s: float = 0.0
    keeper_bytes: dict[str, int] = field(default_factory=dict)  # as the keepers reported


class MemoryTier:
    """Snapshots and restores of one rank (see the module docstring)."""

    def __init__(self, run: Run, manager: CheckpointManager, every: int, keepers: list[str],
                 node: int, token: str) -> None:
        if not 0 <= node < len(keepers):
            raise ValueError(f"node {node} has no keeper in {KEEPERS_ENV} ({len(keepers)} given)")
        self.run, self.manager, self.every = run, manager, every
        self.node = node
        self.own = KeeperClient(keepers[node], token)
        buddy = (node + 1) % len(keepers)
        self.buddy = KeeperClient(keepers[buddy], token) if buddy != node else None
        # Restore asks every keeper (own node's first): keepers hold shards by (job, rank),
        # so a relaunch that places nodes in another order still finds each rank's copy.
        self.all = [self.own] + [KeeperClient(k, token) for i, k in enumerate(keepers) if i != node]
        self.stats = SnapshotStats()
        self.restore_s: dict[str, float] = {}  # the last restore's laps (see `restore`)
        self.restore_bytes: dict[str, int] = {"read": 0, "direct": 0}
        self._bufs: dict[str, torch.Tensor] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cb-memtier")
        self._inflight: Future | None = None
        self._warned = False
        self._layout: Layout | None = None
        self._copied: threading.Event | None = None
        # The shard copy overlaps the next forward/backward when an optimizer step can
        # fence it; any other set-up (several optimizers, none) copies on this thread.
        optim = getattr(manager, "optim", None)  # None: no manager (address-only uses)
        self._single_optim = isinstance(optim, torch.optim.Optimizer)
        self._overlap = self._single_optim
        self.overlap_min_bytes = OVERLAP_MIN_BYTES
        if self._overlap:
            optim.register_step_pre_hook(lambda *_: self.fence())

    @classmethod
    def from_env(cls, run: Run, manager: CheckpointManager) -> MemoryTier | None:
        every = int(os.environ.get(EVERY_ENV, "0") or 0)
        keepers = [k for k in os.environ.get(KEEPERS_ENV, "").split(",") if k]
        if every <= 0 or not keepers:
            return None
        names, addresses = parse_keepers(keepers)
        if names:  # named keepers: this rank's is its node's (see the module docstring)
            node_id = os.environ.get(NODE_ID_ENV, "")
            if node_id not in names:
                run.log(f"memory tier off: this rank's node {node_id or '(unknown)'} has no "
                        f"keeper in {KEEPERS_ENV} ({', '.join(names)}); recovery uses the store")
                return None
            node = names.index(node_id)
        else:
            node = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0")) or 0)
        return cls(run, manager, every, addresses, node, os.environ.get(TOKEN_ENV, ""))

    # -------------------------------------------------------------- snapshot
    def busy(self) -> bool:
        """The previous snapshot is still being copied or sent."""
        return self._inflight is not None and not self._inflight.done()

    def maybe_snapshot(self, step: int, samples_seen: int, any_busy: bool = False) -> None:
        """Every `every` steps: take this rank's state; the copy of its shards into the
        host buffers and the send run on the tier's thread (see `_overlap`).

        `any_busy`: some rank's previous snapshot was still being sent when the ranks
        last agreed (`Run.step_done`); then every rank skips this one. Why agreed and not
        each rank's own view: a rank that skipped alone left the keepers with other
        steps of it than of the others, and a node lost then found no step every rank
        held newer than the durable checkpoint (seen at 58M parameters, where a
        snapshot takes about a step to send). Agreed, a snapshot starts on any rank
        only once every rank's previous one is complete, so the newest complete step
        is the same for all ranks and a keeper needs to hold only that one while the
        next arrives (trainer/memkeeper.py)."""
        if step % self.every:
            return
        if any_busy or self.busy():
            self.stats.skipped += 1
            return
        t0 = time.perf_counter()
        layout = self._current_layout()
        small = self._small_items(layout, step, samples_seen)
        copied = threading.Event()
        if self._overlap and layout.nbytes >= self.overlap_min_bytes:
            self._copied = copied
        else:  # nothing fences the next update: copy here
            self._copy(layout)
            copied.set()
        self.stats.copy_s += time.perf_counter() - t0
        self.stats.taken += 1
        self._inflight = self._pool.submit(self._stage_and_send, step, layout, small, copied)

    def _current_layout(self) -> Layout:
        """The flattened keys of the model's and optimizer's state with the live local
        tensor behind each. Why cached: `get_state_dict` walks every parameter's name
        and FSDP metadata (measured at 7+ ms a step for the small model, most of the
        snapshot's cost on the training thread); the tensors it returns are the live
        ones, updated in place, so the walk is redone only when a live tensor is
        replaced (a restore, an optimizer whose state appears later)."""
        fp = self._fingerprint()
        if self._layout is None or fp is None or self._layout.fingerprint != fp:
            msd, osd = get_state_dict(self.manager.model, self.manager.optim)
            flat, mapping = flatten_state_dict({"model": msd, "optim": osd})
            tensors: list[tuple[str, torch.Tensor]] = []
            const: dict[str, Any] = {}
            live: dict[str, tuple[int, str]] = {}
            chunks: dict[str, tuple[list[int], list[int]]] = {}
            for key, value in flat.items():
                if isinstance(value, DTensor):
                    offsets, size = memreshard.chunk_of(key, value)
                    piece = memreshard.replica_piece(value.to_local(),
                                                     *memreshard.replica_share(value))
                    if piece is None:  # another replica of this chunk keeps it
                        continue
                    value, first_row = piece
                    if first_row:
                        offsets = [offsets[0] + first_row, *offsets[1:]]
                    chunks[key] = (offsets, size)
                if isinstance(value, torch.Tensor):
                    tensors.append((key, value.detach()))
                    continue
                path = mapping[key]
                if (fp is not None and path[:2] == ("optim", "param_groups")
                        and path[3] != "params"):
                    live[key] = (int(path[2]), str(path[3]))  # lr & co: a scheduler moves them
                else:
                    const[key] = copy.deepcopy(value)
            self._layout = Layout(fp, tensors, const, live, chunks)
        return self._layout

    def _fingerprint(self) -> tuple[int, ...] | None:
        """Where every live model/optimizer tensor is: changes when one is replaced
        (None: not cached, e.g. several optimizers)."""
        if not self._single_optim:
            return None
        ptrs: list[int] = []
        for t in list(self.manager.model.parameters()) + list(self.manager.model.buffers()):
            t = t._local_tensor if isinstance(t, DTensor) else t
            ptrs.append(t.data_ptr())
        if self.manager.optim is not None:
            for st in self.manager.optim.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        v = v._local_tensor if isinstance(v, DTensor) else v
                        ptrs.append(v.data_ptr())
            ptrs.append(len(self.manager.optim.param_groups))
        return tuple(ptrs)

    def _small_items(self, layout: Layout, step: int, samples_seen: int) -> dict[str, Any]:
        """Everything but the big tensors, taken now on the training thread (it changes
        at the very next step): trainer state, RNGs, the optimizer's hyperparameters."""
        flat, _ = flatten_state_dict({"trainer": self.manager.trainer_state(step, samples_seen)})
        small = {k: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                 for k, v in flat.items()}
        small.update(layout.const)
        groups = self.manager.optim.param_groups if self.manager.optim is not None else []
        for key, (i, name) in layout.live.items():
            small[key] = copy.deepcopy(groups[i][name])
        return small

    def _copy(self, layout: Layout) -> None:
        for key, value in layout.tensors:
            buf = self._bufs.get(key)
            if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                buf = self._bufs[key] = torch.empty(value.shape, dtype=value.dtype)
            buf.copy_(value)

    def fence(self) -> None:
        """Wait until the snapshot's copy of the live shards is done. Runs before every
        optimizer step (a pre-hook): the copy overlaps the next forward and backward,
        which only read the parameters and optimizer state, never write them."""
        ev = self._copied
        if ev is not None:
            t0 = time.perf_counter()
            ev.wait()
            self.stats.fence_s += time.perf_counter() - t0
            self._copied = None

    def _stage_and_send(self, step: int, layout: Layout, small: dict[str, Any],
                        copied: threading.Event) -> None:
        try:
            if not copied.is_set():
                t0 = time.perf_counter()
                self._copy(layout)
                self.stats.side_copy_s += time.perf_counter() - t0
        finally:
            copied.set()
        self._send(step, encode(step, self.run.world_size, small,
                                [(k, self._bufs[k]) for k, _ in layout.tensors], layout.chunks))

    def _send(self, step: int, segments: list[memoryview]) -> None:
        t0 = time.perf_counter()
        size = sum(s.nbytes for s in segments)
        header = {"op": "put", "job": self.run.env.job_id, "rank": self.run.rank, "step": step,
                  "world": self.run.world_size}
        ok = True
        for client in (self.own, self.buddy):
            if client is None:
                continue
            try:
                reply, _ = client.request(header, segments)
                ok = ok and bool(reply.get("ok"))
                self.stats.keeper_bytes[client.address] = int(reply.get("bytes", 0))
            except OSError as exc:
                ok = False
                if not self._warned:  # the tier degrades to the store; say so once
                    self._warned = True
                    self.run.log(f"memory tier: keeper {client.address} unreachable ({exc}); "
                                 "recovery falls back to the store while it is")
        if not ok:
            self.stats.failed += 1
        if self.stats.bytes == 0 and self.run.rank == 0:
            self.run.log(f"memory tier: snapshot of rank 0 is {size / 1e6:.1f} MB, "
                         f"every {self.every} step(s), copied to "
                         f"{2 if self.buddy is not None else 1} keeper(s)")
        self.stats.bytes = size
        self.stats.send_s += time.perf_counter() - t0
        self.run.progress.update(lazy=True, memory_tier=self.report())  # rank 0's view

    def report(self) -> dict[str, Any]:
        """What this rank's tier costs and holds: snapshots taken / skipped (still
        sending) / failed, one snapshot's bytes, seconds on the training thread per
        snapshot, and the bytes each keeper it sends to said it holds (all ranks)."""
        s = self.stats
        return {"every": self.every, "taken": s.taken, "skipped": s.skipped, "failed": s.failed,
                "snapshot_bytes": s.bytes,
                "copy_s_per_snapshot": (s.copy_s + s.fence_s) / max(1, s.taken),
                "side_copy_s_per_snapshot": s.side_copy_s / max(1, s.taken),
                "keeper_bytes": dict(s.keeper_bytes)}

    def wait(self) -> None:
        """Until the last snapshot is copied and sent."""
        if self._inflight is not None:
            self._inflight.result()
        self._copied = None

    # --------------------------------------------------------------- restore
    def _index(self) -> dict[tuple[int, int, int], list[KeeperClient]]:
        """(old rank, step, world size it was taken on) -> the keepers holding that shard,
        the own node's first. Every keeper is asked at once (one that is slow to answer
        delays the others by nothing); a keeper that does not answer holds nothing."""
        header = {"op": "index", "job": self.run.env.job_id}

        def ask(client: KeeperClient) -> dict[str, Any]:
            try:
                return client.request(header)[0]
            except OSError:
                return {}

        with ThreadPoolExecutor(max_workers=len(self.all), thread_name_prefix="cb-memindex") as pool:
            replies = list(pool.map(ask, self.all))
        held: dict[tuple[int, int, int], list[KeeperClient]] = {}
        for client, reply in zip(self.all, replies, strict=True):  # the own node's first
            for rank, steps in (reply.get("ranks") or {}).items():
                for step, world in steps.items():
                    if int(world) > 0:
                        held.setdefault((int(rank), int(step), int(world)), []).append(client)
        return held

    def _gather(self, obj: Any) -> list[Any]:
        world = self.run.world_size
        if world == 1:
            return [obj]
        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj)
        return out

    def restore(self, min_step: int) -> Restored | None:
        """Restore the newest step >= `min_step` whose every old rank's shard the keepers
        hold, on this world size or resharded from another; None: every rank falls back
        to the store. Collective: every rank calls it. `restore_s` says afterwards where
        this rank's time went (index, heads, prepare, read, apply, agree)."""
        self.restore_s = {}
        self.restore_bytes = {"read": 0, "direct": 0}
        self._seeded = False  # the optimizer's state was made from the snapshot
        lap = _Laps(self.restore_s)
        held = self._index()
        views = self._gather(sorted(held))
        choice = newest_complete([{tuple(x) for x in v} for v in views], max(1, min_step))
        lap("index")
        if choice is None:
            return None
        step, saved_world = choice
        failure, peer = "", False
        try:
            if saved_world == self.run.world_size and not self._replicated():
                client = held[(self.run.rank, step, saved_world)][0]
                peer = client is not self.own
                self._own_shard(client, step, lap)
            else:
                peer = self._reshard(step, saved_world, held, lap)
                if saved_world == self.run.world_size:
                    # replicas' parts: every rank reads some from other nodes' keepers, as
                    # planned; "from a peer" stays what it says on the same world size,
                    # that this rank's own old shard came from another node's copy
                    peer = self.own not in held[(self.run.rank, step, saved_world)]
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - every rank falls back
            failure = f"rank {self.run.rank}: {(str(exc).strip().splitlines() or [repr(exc)])[-1]}"
        outcomes = self._gather((failure, peer))
        lap("agree")
        bad = [f for f, _ in outcomes if f]
        if bad:
            self.run.log(f"memory tier: restore of step {step} failed ({bad[0]}); using the store")
            self.manager._prepared = None
            if self._seeded:  # a fresh optimizer again: the store (or step 0) makes its state
                self.manager.optim.state.clear()
            return None
        return Restored(step, saved_world, [r for r, (_, p) in enumerate(outcomes) if p])

    def _replicated(self) -> bool:
        """The model is replicated over ranks (HSDP): each rank's snapshot holds only its
        part of its replicas' shard (`memreshard.replica_piece`), so even on the same
        world size a rank's state is read from several snapshots, through DCP."""
        return any(isinstance(p, DTensor) and memreshard.replica_share(p)[1] > 1
                   for p in self.manager.model.parameters())

    def _sources(self, step: int, saved_world: int,
                 held: dict[tuple[int, int, int], list[KeeperClient]]) -> dict[int, KeeperClient]:
        """The keeper each old rank's snapshot is read from: the own node's when it holds
        it (no network), else of its holders the one this restore asks least so far, so
        the reads spread over the keepers instead of queueing at one."""
        asked: dict[str, int] = {}
        out: dict[int, KeeperClient] = {}
        for q in range(saved_world):
            holders = held[(q, step, saved_world)]
            pick = holders[0] if holders[0] is self.own else min(
                holders, key=lambda c: asked.get(c.address, 0))
            asked[pick.address] = asked.get(pick.address, 0) + 1
            out[q] = pick
        return out

    def _reshard(self, step: int, saved_world: int,
                 held: dict[tuple[int, int, int], list[KeeperClient]], lap: _Laps) -> bool:
        """Load step `step` of a `saved_world`-rank run onto this world size through DCP
        (trainer/memreshard.py); True when any bytes came from another node's keeper.

        Every old rank's snapshot is read on a connection of its own, all at once (the
        heads, then the shards' bytes straight into the live tensors: `SnapshotReader`)."""
        from trainer.checkpoint import RNG_PER_RANK

        job = self.run.env.job_id
        sources = self._sources(step, saved_world, held)
        conns = {q: KeeperClient(c.address, c.token) for q, c in sources.items()}
        fetchers = {q: _fetcher(conn, job, q, step) for q, conn in conns.items()}

        def fetch(q: int, ranges: list[tuple[int, int]], into: list[memoryview]) -> None:
            fetchers[q](ranges, into)

        def head_of(q: int) -> memreshard.Head:
            head, start = _read_head(fetchers[q])
            if int(head["step"]) != step or int(head["world_size"]) != saved_world \
                    or "chunks" not in head:
                raise RuntimeError(f"rank {q}'s snapshot is not step {step} of {saved_world} ranks")
            return memreshard.Head(q, head["tensors"], head["small"], head["chunks"], start)

        try:
            with ThreadPoolExecutor(max_workers=min(saved_world, READ_PARALLEL),
                                    thread_name_prefix="cb-memhead") as pool:
                heads = list(pool.map(head_of, range(saved_world)))
            lap("heads")
            stored = {key: (dtype, list(h.chunks[key][1]) if key in h.chunks else list(shape),
                            key in h.chunks) for h in heads for key, dtype, shape, _ in h.tensors}
            self._seeded = seed_optimizer_state(self.manager.optim, self.manager.model, stored,
                                                {k: v for h in heads for k, v in h.small.items()})
            prepared = self.manager.prepare_load()
            prepared["trainer"][rng.PER_RANK_KEY] = rng.load_template(self.run.rank, saved_world)
            reader = memreshard.SnapshotReader(memreshard.global_metadata(heads), heads, fetch,
                                               parallel=READ_PARALLEL)
            lap("prepare")
            dcp.load(prepared, storage_reader=reader, no_dist=True)
            self.restore_bytes = {"read": reader.bytes_read, "direct": reader.direct_bytes}
            lap("read")
        finally:
            for conn in conns.values():
                conn.close()
        self.manager._prepared = None
        extra = self.manager.apply_state(prepared, {"rng": RNG_PER_RANK, "step": step})
        lap("apply")
        if int(extra["step"]) != step:
            raise RuntimeError(f"snapshot says step {extra['step']}, expected {step}")
        return any(sources[q] is not self.own for q in reader.read_from)

    def _own_shard(self, client: KeeperClient, step: int, lap: _Laps) -> None:
        """Same world size, unreplicated: this rank's old shard into its live tensors. The
        snapshot's head first, then every tensor's bytes in ranged gets received straight
        into the live tensor each restores (no buffer of the whole snapshot, no copy
        after; a tensor whose dtype or layout differs goes through a scratch tensor)."""
        from trainer.checkpoint import RNG_PER_RANK

        rank, world = self.run.rank, self.run.world_size
        conn = KeeperClient(client.address, client.token)
        try:
            fetch = _fetcher(conn, self.run.env.job_id, rank, step)
            head, start = _read_head(fetch)
            if int(head["world_size"]) != world or int(head["step"]) != step:
                raise RuntimeError(f"snapshot is step {head['step']} of {head['world_size']} ranks")
            lap("heads")
            stored, small, chunks = head["tensors"], head["small"], head.get("chunks")
            if chunks is not None:  # which tensors are DTensor chunks: the state's types
                self._seeded = seed_optimizer_state(
                    self.manager.optim, self.manager.model,
                    {key: (dtype, list(chunks[key][1]) if key in chunks else list(shape),
                           key in chunks) for key, dtype, shape, _ in stored}, small)
            prepared = self.manager.prepare_load()
            prepared["trainer"][rng.PER_RANK_KEY] = rng.load_template(rank, world)
            flat, mapping = flatten_state_dict(prepared)
            keys = {key for key, *_ in stored} | set(small)
            if keys != set(flat):
                diff = sorted(keys ^ set(flat))
                raise RuntimeError(f"snapshot keys differ from the model's: {diff[:4]}")
            ranges: list[tuple[int, int]] = []
            dests: list[memoryview] = []
            scratch: list[tuple[torch.Tensor, torch.Tensor]] = []
            off = start
            for key, dtype_name, shape, nbytes in stored:
                local = _local(flat[key], key)
                if list(local.shape) != list(shape):
                    raise RuntimeError(f"{key}: shard shape {tuple(shape)} != {tuple(local.shape)}")
                dtype = getattr(torch, dtype_name)
                if nbytes:
                    if local.dtype == dtype and local.is_contiguous() and local.device.type == "cpu":
                        dests.append(byte_view(local))
                    else:
                        tmp = torch.empty(shape, dtype=dtype)
                        dests.append(byte_view(tmp))
                        scratch.append((local, tmp))
                    ranges.append((off, nbytes))
                off += nbytes
            lap("prepare")
            fetch(ranges, dests)
            for local, tmp in scratch:
                local.copy_(tmp)
            read = sum(n for _, n in ranges)
            self.restore_bytes = {"read": read,
                                  "direct": read - sum(t.nbytes for _, t in scratch)}
            lap("read")
        finally:
            conn.close()
        for key, value in small.items():
            target = flat[key]
            if isinstance(target, torch.Tensor):
                local = _local(target, key)
                if local.shape != value.shape:
                    raise RuntimeError(f"{key}: shape {tuple(value.shape)} != {tuple(local.shape)}")
                local.copy_(value)
            else:
                set_element(prepared, mapping[key], value)
        self.manager._prepared = None
        extra = self.manager.apply_state(prepared, {"rng": RNG_PER_RANK, "step": step})
        lap("apply")
        if int(extra["step"]) != step:
            raise RuntimeError(f"snapshot says step {extra['step']}, expected {step}")


OPTIM_STATE = "optim.state."  # flattened optimizer state keys: optim.state.<fqn>.<name>


def seed_optimizer_state(optim: Any, model: torch.nn.Module,
                         stored: dict[str, tuple[str, list[int], bool]],
                         small: dict[str, Any]) -> bool:
    """Give a never-stepped optimizer the state a snapshot says it had (empty tensors of
    each entry's dtype and global shape, the small entries as saved), so that a restore
    reads the snapshot straight into them; False (nothing done) when that cannot be
    derived safely, and the restore then lets `get_state_dict` make the state as before.

    Why: on an optimizer without state, `get_state_dict` (and `set_state_dict`) first run
    a zero-lr `step()` over every parameter to make it (`_init_optim_state`); for AdamW
    on FSDP2 that is several full passes over the parameters, each allocating a
    parameter-sized temporary, through DTensor's dispatch: measured at two thirds of a
    58M-parameter rank's restore from the keepers, longer than reading the bytes. The
    values it computes are overwritten by the restore anyway.

    ``stored``: flattened key -> (dtype, global shape, sharded: a DTensor's chunk) of the
    snapshot's tensors; ``small``: its small items. Only the ``optim.state.<fqn>.<name>``
    entries are used, and only when every parameter the optimizer holds gets state, every
    sharded entry has its parameter's global shape (made like the parameter, a DTensor
    of its placements) and every plain one is a scalar (AdamW's ``step``) or the shape of
    its plain parameter (AdamW, Adam, SGD with momentum...; an optimizer with factored
    state, e.g. Adafactor, keeps the old way)."""
    if not isinstance(optim, torch.optim.Optimizer) or optim.state:
        return False
    by_fqn = dict(model.named_parameters())
    state: dict[str, dict[str, Any]] = {}
    for key in [*stored, *small]:
        if not key.startswith(OPTIM_STATE):
            continue
        fqn, _, name = key.removeprefix(OPTIM_STATE).rpartition(".")
        param = by_fqn.get(fqn)
        if param is None:
            return False
        if key in stored:
            dtype_name, shape, sharded = stored[key]
            dtype = getattr(torch, dtype_name)
            like_param = list(param.shape) == list(shape) and sharded == isinstance(param, DTensor)
            if like_param:
                value: Any = torch.empty_like(param, dtype=dtype, requires_grad=False)
            elif not sharded and not shape:
                value = torch.zeros((), dtype=dtype)
            else:
                return False
        else:
            got = small[key]
            value = got.detach().clone() if isinstance(got, torch.Tensor) else copy.deepcopy(got)
        state.setdefault(fqn, {})[name] = value
    fqn_of = {id(p): fqn for fqn, p in by_fqn.items()}
    held = [p for g in optim.param_groups for p in g["params"]]
    if not held or any(fqn_of.get(id(p)) not in state for p in held):
        return False
    for p in held:
        optim.state[p] = state[fqn_of[id(p)]]
    return True


def _local(target: Any, key: str) -> torch.Tensor:
    """The live local tensor behind a state dict entry (a DTensor's local shard)."""
    if not isinstance(target, torch.Tensor):
        raise RuntimeError(f"{key}: the snapshot has a tensor, the model has {type(target).__name__}")
    return target.to_local() if isinstance(target, DTensor) else target


Fetch = Callable[[list[tuple[int, int]], list[memoryview]], None]


def _fetcher(conn: KeeperClient, job: str, rank: int, step: int) -> Fetch:
    """Ranged gets of one snapshot over ``conn``: ([(offset, length)], [destination])
    -> the bytes received into the destinations (views of the same sizes, in order)."""

    def fetch(ranges: list[tuple[int, int]], into: list[memoryview]) -> None:
        for i in range(0, len(ranges), RANGES_PER_GET):
            part = ranges[i:i + RANGES_PER_GET]
            try:
                conn.request_into({"op": "get", "job": job, "rank": rank, "step": step,
                                   "ranges": [list(r) for r in part]}, into[i:i + RANGES_PER_GET])
            except RuntimeError as exc:
                raise RuntimeError(f"rank {rank}'s step {step}: {exc}") from None

    return fetch


def _read_head(fetch: Fetch) -> tuple[dict[str, Any], int]:
    """A snapshot's head (`encode`) and where its tensor bytes start, in two small gets."""
    prefix = bytearray(PREFIX)
    fetch([(0, PREFIX)], [memoryview(prefix)])
    raw = bytearray(head_length(prefix))
    fetch([(PREFIX, len(raw))], [memoryview(raw)])
    return load_head(raw), PREFIX + len(raw)
