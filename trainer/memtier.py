"""The in-memory recovery tier, rank side: snapshot this rank's shard every K steps into
its node's keeper and its buddy node's keeper; restore from them on a same-size restart.

Why (docs/recovery.md): the store tier loses every step since the last periodic
checkpoint and re-reads the whole checkpoint. Here every `K` steps each rank copies its
own shard (FSDP local shards, not a full state dict) plus the trainer state (step,
scheduler, data position, every RNG) into host buffers allocated once (the only work on
the training thread), and a background thread serializes it and sends it to two keepers
(trainer/memkeeper.py): its own node's and the next node's (a ring over nodes). A node
lost with its keeper leaves every shard it held on the buddy. Sending goes over plain
TCP, never a collective, so it cannot interleave with FSDP's gloo/NCCL traffic.

Restore needs the same world size (replace in place: survivors plus a spare in the
lost node's place, in any node order: keepers hold shards by rank and every keeper is
asked): ranks agree on the newest step every rank can fetch,
copy the shards into their live tensors, and report `resume_tier: memory`. Anything
else (another world size, a shard with both copies gone, a keeper unreachable) falls
back to the store, which reshards N -> M as before.

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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.tensor import DTensor

from trainer import rng
from trainer.memkeeper import TOKEN_ENV, recv_msg, send_msg

if TYPE_CHECKING:
    from trainer.checkpoint import CheckpointManager
    from trainer.run import Run

EVERY_ENV = "CB_MEMORY_EVERY"
KEEPERS_ENV = "CB_MEMORY_KEEPERS"
NODE_ID_ENV = "CB_NODE_ID"  # the node's name, as the launcher names keepers
CONNECT_TIMEOUT_S = 5.0


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

    def request(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        with self._lock:
            for attempt in (0, 1):
                try:
                    if self._sock is None:
                        self._sock = socket.create_connection(self._addr, timeout=CONNECT_TIMEOUT_S)
                        self._sock.settimeout(60.0)
                    send_msg(self._sock, {**header, "token": self.token}, payload)
                    return recv_msg(self._sock)
                except OSError:
                    if self._sock is not None:
                        self._sock.close()
                    self._sock = None
                    if attempt:
                        raise
        raise AssertionError("unreachable")


@dataclass
class SnapshotStats:
    """What the tier reports (logged at the end, and per snapshot size once)."""

    taken: int = 0
    skipped: int = 0  # the previous one was still sending
    failed: int = 0
    bytes: int = 0  # one snapshot of this rank, serialized
    copy_s: float = 0.0  # total time on the training thread
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
        self._bufs: dict[str, torch.Tensor] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cb-memtier")
        self._inflight: Future | None = None
        self._warned = False

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
    def maybe_snapshot(self, step: int, samples_seen: int) -> None:
        """Every `every` steps: copy this rank's state now, send it in the background."""
        if step % self.every:
            return
        if self._inflight is not None and not self._inflight.done():
            self.stats.skipped += 1
            return
        t0 = time.perf_counter()
        flat, _ = flatten_state_dict(self.manager._state(step, samples_seen))
        staged: dict[str, Any] = {}
        for key, value in flat.items():
            if isinstance(value, DTensor):
                value = value.to_local()
            if isinstance(value, torch.Tensor):
                buf = self._bufs.get(key)
                if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                    buf = self._bufs[key] = torch.empty(value.shape, dtype=value.dtype)
                buf.copy_(value.detach())
                staged[key] = buf
            else:
                staged[key] = copy.deepcopy(value)
        self.stats.copy_s += time.perf_counter() - t0
        self.stats.taken += 1
        self._inflight = self._pool.submit(self._send, step, staged)

    def _send(self, step: int, staged: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save({"step": step, "world_size": self.run.world_size, "state": staged}, buf)
        payload = buf.getvalue()
        header = {"op": "put", "job": self.run.env.job_id, "rank": self.run.rank, "step": step}
        ok = True
        for client in (self.own, self.buddy):
            if client is None:
                continue
            try:
                reply, _ = client.request(header, payload)
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
            self.run.log(f"memory tier: snapshot of rank 0 is {len(payload) / 1e6:.1f} MB, "
                         f"every {self.every} step(s), copied to 2 keepers")
        self.stats.bytes = len(payload)
        self.stats.send_s += time.perf_counter() - t0
        self.run.progress.update(lazy=True, memory_tier=self.report())  # rank 0's view

    def report(self) -> dict[str, Any]:
        """What this rank's tier costs and holds: snapshots taken / skipped (still
        sending) / failed, one snapshot's bytes, seconds on the training thread per
        snapshot, and the bytes each keeper it sends to said it holds (all ranks)."""
        s = self.stats
        return {"every": self.every, "taken": s.taken, "skipped": s.skipped, "failed": s.failed,
                "snapshot_bytes": s.bytes, "copy_s_per_snapshot": s.copy_s / max(1, s.taken),
                "keeper_bytes": dict(s.keeper_bytes)}

    def wait(self) -> None:
        if self._inflight is not None:
            self._inflight.result()

    # --------------------------------------------------------------- restore
    def _held(self) -> dict[int, KeeperClient]:
        """Steps of this rank's shard the keepers hold: step -> a keeper that has it (the
        own node's when it has it). A keeper that does not answer holds nothing."""
        held: dict[int, KeeperClient] = {}
        header = {"op": "steps", "job": self.run.env.job_id, "rank": self.run.rank}
        for client in reversed(self.all):  # the own node's last, so it wins
            try:
                reply, _ = client.request(header)
            except OSError:
                continue
            for step in reply.get("steps", []):
                held[int(step)] = client
        return held

    def restore(self, min_step: int) -> tuple[int, list[int]] | None:
        """Restore the newest step >= `min_step` that every rank can fetch; returns
        (step, the ranks whose shard came from another node's keeper) or None (all
        ranks fall back to the store).
        Collective: every rank calls it."""
        held = self._held()
        world = self.run.world_size
        gathered: list[Any] = [None] * world
        if world > 1:
            dist.all_gather_object(gathered, sorted(held))
        else:
            gathered = [sorted(held)]
        common = set.intersection(*(set(g) for g in gathered)) if gathered else set()
        candidates = [s for s in common if s >= max(1, min_step)]
        if not candidates:
            return None
        step = max(candidates)
        client = held[step]
        source = "own" if client is self.own else "peer"
        failure = ""
        try:
            reply, payload = client.request(
                {"op": "get", "job": self.run.env.job_id, "rank": self.run.rank, "step": step})
            if not reply.get("ok"):
                raise RuntimeError(reply.get("error", "no payload"))
            self._fill(torch.load(io.BytesIO(payload), weights_only=False), step)
        except Exception as exc:  # noqa: BLE001 - any failure: every rank falls back
            failure = f"rank {self.run.rank}: {exc}"
        outcomes: list[Any] = [None] * world
        if world > 1:
            dist.all_gather_object(outcomes, (failure, source))
        else:
            outcomes = [(failure, source)]
        bad = [f for f, _ in outcomes if f]
        if bad:
            self.run.log(f"memory tier: restore of step {step} failed ({bad[0]}); using the store")
            self.manager._prepared = None
            return None
        return step, [r for r, (_, src) in enumerate(outcomes) if src == "peer"]

    def _fill(self, saved: dict[str, Any], step: int) -> None:
        """Copy a snapshot into the live state (same world size, same shard shapes)."""
        from trainer.checkpoint import RNG_PER_RANK

        if int(saved["world_size"]) != self.run.world_size:
            raise RuntimeError(f"snapshot from {saved['world_size']} ranks")
        prepared = self.manager.prepare_load()
        prepared["trainer"][rng.PER_RANK_KEY] = rng.load_template(self.run.rank, self.run.world_size)
        flat, mapping = flatten_state_dict(prepared)
        snap = saved["state"]
        if set(snap) != set(flat):
            diff = sorted(set(snap) ^ set(flat))
            raise RuntimeError(f"snapshot keys differ from the model's: {diff[:4]}")
        for key, target in flat.items():
            value = snap[key]
            if isinstance(target, torch.Tensor):
                local = target.to_local() if isinstance(target, DTensor) else target
                if local.shape != value.shape:
                    raise RuntimeError(f"{key}: shard shape {tuple(value.shape)} != {tuple(local.shape)}")
                local.copy_(value)
            else:
                set_element(prepared, mapping[key], value)
        self.manager._prepared = None
        extra = self.manager.apply_state(prepared, {"rng": RNG_PER_RANK, "step": step})
        if int(extra["step"]) != step:
            raise RuntimeError(f"snapshot says step {extra['step']}, expected {step}")
