"""Free-capacity index by topology domain, so placement never scans every node.

Nodes are grouped into *partitions*: one capacity pool of one cluster (agent),
i.e. the same agent, region, accelerator, capacity type, pool, price and plan
window. A gang is placed inside exactly one partition (Kueue's "one flavor per
resource"): it never spans two agents, and its Admission has one capacity type,
pool and price.

Inside a partition the domains form a tree::

    agent -> zone -> layer1 -> layer2 -> layer3 -> ultraserver -> node

A level whose label is missing on a node is skipped for that node (its domain
hangs off the nearest labelled ancestor), so a node with no topology labels sits
directly under its zone: it can host single-node jobs at any `required` level but
is never counted as "inside one layer-3 block" for a multi-node gang.

Every domain keeps ``cnt[k]`` = number of its nodes with at least ``k`` free GPUs.
That answers "can this domain hold n nodes x g GPUs?" in O(1), and an allocation
updates only the node's ~6 ancestors. Single-node jobs use per-partition buckets
of nodes by free-GPU count (best fit without a scan).

Over 400 lines on purpose: ``CapacityIndex`` is one data structure whose counts, buckets
and domain tree must change together on every allocation and release.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from placement.model import CapacityType, NodeInfo, TopologyLevel

NODE_LEVEL = 0  # tighter than any TopologyLevel: a single node
AGENT_LEVEL = int(TopologyLevel.REGION)  # a gang never spans agents, so "region" = agent
LEVEL_NAMES = {
    NODE_LEVEL: "node",
    int(TopologyLevel.ULTRASERVER): "UltraServer",
    int(TopologyLevel.LAYER_3): "layer-3 block",
    int(TopologyLevel.LAYER_2): "layer-2 block",
    int(TopologyLevel.LAYER_1): "layer-1 block",
    int(TopologyLevel.ZONE): "zone",
    AGENT_LEVEL: "cluster",
}
# Bucket classes for single-node best fit: partly used nodes first, whole nodes of
# an UltraServer last (they are the scarce 72-GPU NVLink domains).
_PLAIN, _US_PARTIAL, _US_WHOLE = 0, 1, 2


def level_of(required: TopologyLevel | int) -> int:
    """Map a job's topology level to an index level (NONE and REGION = whole agent)."""
    lvl = int(required)
    return AGENT_LEVEL if lvl in (0, AGENT_LEVEL) else lvl


class Domain:
    """One topology domain inside a partition."""

    __slots__ = ("level", "label", "cnt", "free", "subs", "bare", "order")

    def __init__(self, level: int, label: str, maxg: int, order: int) -> None:
        self.level = level
        self.label = label
        self.cnt = [0] * (maxg + 1)
        self.free = 0
        self.subs: list[Domain] = []
        self.bare: list[Slot] = []
        self.order = order


class Slot:
    """A usable node and its mutable free-GPU count."""

    __slots__ = ("info", "free", "doms", "part", "klass", "order")

    def __init__(self, info: NodeInfo, free: int, part: Partition, order: int,
                 doms: list[Domain] | None = None, klass: int = _PLAIN) -> None:
        self.info = info
        self.free = free
        self.doms: list[Domain] = [] if doms is None else doms
        self.part = part
        self.klass = klass
        self.order = order


class Partition:
    """One capacity pool of one agent: the unit a gang is placed in."""

    __slots__ = (
        "key", "agent_id", "region", "accelerator", "capacity_type", "pool", "price",
        "risk", "plan_start", "plan_end", "future", "maxg", "levels", "root", "slots",
        "buckets", "us_max_nodes", "order", "total", "version",
    )

    def __init__(self, key: tuple, first: NodeInfo, maxg: int, future: bool, order: int) -> None:
        self.key = key
        self.agent_id = first.agent_id
        self.region = first.region
        self.accelerator = first.accelerator
        self.capacity_type = CapacityType(first.capacity_type)
        self.pool = first.pool
        self.price = first.price_per_gpu_hour
        self.risk = first.interruption_risk
        self.plan_start = first.plan_start
        self.plan_end = first.plan_end
        self.future = future  # a scheduled plan not started yet
        self.maxg = maxg
        self.levels: dict[int, list[Domain]] = {}
        self.root = Domain(AGENT_LEVEL, f"{first.region}/{first.agent_id}", maxg, 0)
        self.slots: list[Slot] = []
        # buckets[klass][free] = nodes with exactly ``free`` free GPUs, insertion
        # ordered (a dict used as an ordered set); lists, not a tuple-keyed dict,
        # because best_single probes them for every single-node job.
        self.buckets: list[list[dict[Slot, None]]] = [[{} for _ in range(maxg + 1)] for _ in range(3)]
        self.us_max_nodes = 0
        self.order = order
        self.total = 0
        self.version = 0  # bumped on every change of one of its nodes (CapacityIndex.find caches on it)

    @property
    def label(self) -> str:
        kind = CapacityType(self.capacity_type).name.lower()
        return f"{self.agent_id}:{kind}{':' + self.pool if self.pool else ''}"


def partition_key(n: NodeInfo) -> tuple:
    return (
        n.agent_id, n.region, n.accelerator, int(n.capacity_type), n.pool,
        n.price_per_gpu_hour, n.interruption_risk,
        -1.0 if n.plan_start is None else n.plan_start,
        -1.0 if n.plan_end is None else n.plan_end,
    )


class CapacityIndex:
    """Free capacity of usable nodes, by partition and topology domain."""

    def __init__(self, nodes: Iterable[tuple[NodeInfo, int]], future: bool = False) -> None:
        grouped: dict[tuple, list[tuple[NodeInfo, int]]] = {}
        for info, free in nodes:
            grouped.setdefault(partition_key(info), []).append((info, free))
        self.partitions: list[Partition] = []
        self.slot_by_id: dict[str, Slot] = {}
        self.version = 0  # bumped on every change: lets callers cache derived answers
        # Undo journal (placement/incremental.py): while a list, every change records
        # (slot, free before) so a kept-alive index can be put back after a pass.
        self.journal: list[tuple[Slot, int]] | None = None
        # (partition, n, g, max_level) -> (partition version, find's answer): a victim
        # search asks every eligible partition again after each simulated release, and
        # most of them did not change.
        self._found: dict[tuple, tuple] = {}
        for order, key in enumerate(sorted(grouped)):
            group = grouped[key]
            topo = [_topo_key(info) for info, _ in group]  # C-level getter, no per-node lambda
            members = [group[i] for i in sorted(range(len(group)), key=topo.__getitem__)]
            self.partitions.append(self._build(key, members, future, order))

    def rebuild_partition(self, members: list[tuple[NodeInfo, int]]) -> None:
        """Build again the one partition ``members`` (every usable node of it, with its
        free GPUs) belong to, in place: what ``CapacityIndex(...)`` over the whole
        fleet builds for it, since a partition's slots, domains, orders and buckets
        depend on its own nodes alone. The partition must exist (a partition appearing
        or vanishing changes the others' order: build the index afresh then)."""
        key = partition_key(members[0][0])
        i = next(i for i, p in enumerate(self.partitions) if p.key == key)
        old = self.partitions[i]
        for slot in old.slots:
            if self.slot_by_id.get(slot.info.id) is slot:
                del self.slot_by_id[slot.info.id]
        topo = [_topo_key(info) for info, _ in members]
        ordered = [members[j] for j in sorted(range(len(members)), key=topo.__getitem__)]
        self.partitions[i] = self._build(key, ordered, old.future, old.order)
        self.version += 1
        self._found.clear()

    def _build(self, key: tuple, members: list[tuple[NodeInfo, int]], future: bool, order: int) -> Partition:
        maxg = max(info.gpus for info, _ in members)
        part = Partition(key, members[0][0], maxg, future, order)
        by_key: dict[tuple, Domain] = {}
        us_sizes: dict[int, int] = {}
        # topology position -> (domain chain, free-GPU histogram, innermost domain).
        # The histogram is added to the chain's domains once at the end: nodes
        # share a handful of chains (one per layer-3 block or UltraServer), so this
        # replaces ~6 domain updates per node with ~6 per chain (the build runs
        # every pass). Members come sorted by topology, so a chain's nodes are
        # consecutive and the lookup runs once per chain, not per node.
        chains: dict[tuple, tuple[list[Domain], list[int], Domain]] = {}
        slots = part.slots
        slot_by_id = self.slot_by_id
        buckets = part.buckets
        total = 0
        prev = None
        for i, (info, free) in enumerate(members):
            topo = (info.zone, info.layer1, info.layer2, info.layer3, info.ultraserver)
            if topo != prev:
                prev = topo
                entry = chains.get(topo)
                if entry is None:
                    entry = chains[topo] = self._chain(part, info, maxg, by_key)
                chain, h, leaf = entry
            if info.ultraserver:
                slot = Slot(info, free, part, i, chain, _US_WHOLE if free >= info.gpus else _US_PARTIAL)
                us_sizes[id(leaf)] = us_sizes.get(id(leaf), 0) + 1
            else:
                slot = Slot(info, free, part, i, chain)
            leaf.bare.append(slot)
            slots.append(slot)
            total += info.gpus
            slot_by_id[info.id] = slot
            h[free] += 1
            if free > 0:
                buckets[slot.klass][free][slot] = None
        part.total += total
        for chain, h, _ in chains.values():
            nz = [(f, c) for f, c in enumerate(h) if c]
            gsum = sum(f * c for f, c in nz)
            for d in chain:
                d.free += gsum
                cnt = d.cnt
                for f, c in nz:
                    cnt[f] += c
        part.us_max_nodes = max(us_sizes.values(), default=0)
        for d in [part.root, *(d for ds in part.levels.values() for d in ds)]:
            cnt = d.cnt
            for k in range(maxg - 1, -1, -1):
                cnt[k] += cnt[k + 1]
        return part

    @staticmethod
    def _chain(part: Partition, info: NodeInfo, maxg: int,
               by_key: dict[tuple, Domain]) -> tuple[list[Domain], list[int], Domain]:
        """The domains from the partition root down to ``info``'s innermost labelled
        level, creating the missing ones (in first-seen order: ``Domain.order``)."""
        parent = part.root
        chain = [part.root]
        path: list[tuple[int, str]] = []  # the domain's key: (level, label) from the zone down
        names = [info.region]  # the domain's label: region/zone/.../label
        for lvl, lab in (
            (int(TopologyLevel.ZONE), info.zone),
            (int(TopologyLevel.LAYER_1), info.layer1),
            (int(TopologyLevel.LAYER_2), info.layer2),
            (int(TopologyLevel.LAYER_3), info.layer3),
            (int(TopologyLevel.ULTRASERVER), info.ultraserver),
        ):
            if not lab and lvl != int(TopologyLevel.ZONE):
                continue
            path.append((lvl, lab))
            names.append(lab)
            dkey = tuple(path)
            dom = by_key.get(dkey)
            if dom is None:
                dom = Domain(lvl, "/".join(names), maxg, len(by_key) + 1)
                by_key[dkey] = dom
                parent.subs.append(dom)
                part.levels.setdefault(lvl, []).append(dom)
            chain.append(dom)
            parent = dom
        return chain, [0] * (maxg + 1), chain[-1]

    # ---- mutation -------------------------------------------------------------------

    def set_free(self, slot: Slot, b: int) -> None:
        a = slot.free
        if a == b:
            return
        self.version += 1
        if self.journal is not None:
            self.journal.append((slot, a))
        part = slot.part
        part.version += 1
        part.buckets[slot.klass][a].pop(slot, None)
        delta = b - a
        if b < a:
            ks = range(b + 1, a + 1)
            for d in slot.doms:
                d.free += delta
                cnt = d.cnt
                for k in ks:
                    cnt[k] -= 1
        else:
            ks = range(a + 1, b + 1)
            for d in slot.doms:
                d.free += delta
                cnt = d.cnt
                for k in ks:
                    cnt[k] += 1
        slot.free = b
        if slot.klass:  # an UltraServer node (plain nodes are always _PLAIN)
            slot.klass = _US_WHOLE if b == slot.info.gpus else _US_PARTIAL
        if b > 0:
            part.buckets[slot.klass][b][slot] = None

    def take(self, slot: Slot, gpus: int) -> None:
        self.set_free(slot, slot.free - gpus)

    def take_each(self, slots: list[Slot], gpus: int) -> None:
        """``take(s, gpus)`` for every slot (a gang's admission); see shift_each."""
        self.shift_each([(s, -gpus) for s in slots])

    def shift_each(self, changes: list[tuple[Slot, int]]) -> None:
        """``set_free(s, s.free + delta)`` for each (slot, delta), in order, with the
        domain counts updated once per topology chain instead of once per change.

        A gang's nodes, and the victims a preemption search releases and takes
        back by the hundred, share a few chains (root .. layer-3 block), so this
        replaces ~6 domain updates per change with ~6 per chain. Same end state,
        same bucket order and the same number of version bumps as the loop of
        set_free calls (nothing reads the counts in between)."""
        if len(changes) < 3:  # too few to share a chain: the batch setup costs more
            for slot, delta in changes:
                self.set_free(slot, slot.free + delta)
            return
        # chain (by identity) -> [domains, change of each cnt[k], change of free GPUs]
        by_chain: dict[int, list] = {}
        journal = self.journal
        for i, (slot, delta) in enumerate(changes):
            a = slot.free
            b = a + delta
            if a == b:
                continue
            if b < 0 or b >= len(slot.doms[0].cnt):  # outside the counts: the plain path
                self._apply(by_chain)
                for s2, d2 in changes[i:]:
                    self.set_free(s2, s2.free + d2)
                return
            self.version += 1
            if journal is not None:
                journal.append((slot, a))
            part = slot.part
            part.version += 1
            buckets = part.buckets
            buckets[slot.klass][a].pop(slot, None)
            doms = slot.doms
            entry = by_chain.get(id(doms))
            if entry is None:
                entry = by_chain[id(doms)] = [doms, [0] * len(doms[0].cnt), 0]
            diff = entry[1]
            if b < a:
                for k in range(b + 1, a + 1):
                    diff[k] -= 1
            else:
                for k in range(a + 1, b + 1):
                    diff[k] += 1
            entry[2] += b - a
            slot.free = b
            if slot.klass:  # an UltraServer node
                slot.klass = _US_WHOLE if b == slot.info.gpus else _US_PARTIAL
            if b > 0:
                buckets[slot.klass][b][slot] = None
        self._apply(by_chain)

    @staticmethod
    def _apply(by_chain: dict[int, list]) -> None:
        """Add shift_each's accumulated count and free-GPU changes to each chain's domains."""
        for doms, diff, moved in by_chain.values():
            nz = [(k, c) for k, c in enumerate(diff) if c]
            for d in doms:
                d.free += moved
                cnt = d.cnt
                for k, c in nz:
                    cnt[k] += c

    def restore(self, touched: Iterable[Slot], free_of: dict[Slot, int]) -> None:
        """Set each touched slot to ``free_of[slot]`` and put every bucket it sits in
        back in node order: the exact state a fresh build over those free counts has
        (domain counts are sums, so only bucket order can remember history, and
        ``best_single`` takes a bucket's first node)."""
        journal, self.journal = self.journal, None
        try:
            for slot in touched:
                self.set_free(slot, free_of[slot])
        finally:
            self.journal = journal
        seen: set[int] = set()
        for slot in touched:
            if slot.free <= 0:
                continue
            bucket = slot.part.buckets[slot.klass][slot.free]
            if id(bucket) in seen or len(bucket) < 2:
                continue
            seen.add(id(bucket))
            ordered = sorted(bucket, key=_slot_order)
            bucket.clear()
            bucket.update(dict.fromkeys(ordered))

    def give(self, slot: Slot, gpus: int) -> None:
        self.set_free(slot, slot.free + gpus)

    # ---- queries --------------------------------------------------------------------

    def find(self, part: Partition, n: int, g: int, max_level: int) -> tuple[int, Domain | None, list[Slot]] | None:
        """Tightest, best-fitting place for n nodes x g GPUs in one partition.

        Returns (level, domain, slots) or None. Levels are tried tightest first;
        within a level, the domain with the fewest fitting nodes (then fewest free
        GPUs) wins: best fit keeps the largest free blocks whole for later gangs.
        """
        if g > part.maxg or part.root.cnt[g] < n:
            return None
        if n == 1:
            slot = self.best_single(part, g)
            return (NODE_LEVEL, None, [slot]) if slot is not None else None
        fk = (id(part), n, g, max_level)
        hit = self._found.get(fk)
        if hit is not None and hit[0] == part.version:
            r = hit[1]
            return None if r is None else (r[0], r[1], list(r[2]))
        r = self._find(part, n, g, max_level)
        self._found[fk] = (part.version, r)
        return None if r is None else (r[0], r[1], list(r[2]))

    def forget_found(self) -> None:
        """Drop ``find``'s cached answers (they stay correct, but a kept-alive index
        would otherwise keep one per gang shape and partition forever)."""
        self._found.clear()

    def _find(self, part: Partition, n: int, g: int, max_level: int) -> tuple[int, Domain | None, list[Slot]] | None:
        """``find`` for a gang (n >= 2), computed: the domain scan and the pick."""
        for lvl in (1, 2, 3, 4, 5):
            if lvl > max_level:
                return None
            if lvl == 1 and part.us_max_nodes < n:
                continue
            best = None
            bc = bf = 0
            for d in part.levels.get(lvl, ()):
                c = d.cnt[g]
                if c >= n and (best is None or c < bc or (c == bc and d.free < bf)):
                    best, bc, bf = d, c, d.free
            if best is not None:
                return lvl, best, self.pick(best, n, g)
        if max_level >= AGENT_LEVEL:
            return AGENT_LEVEL, part.root, self.pick(part.root, n, g)
        return None

    def best_single(self, part: Partition, g: int) -> Slot | None:
        partial, plain, whole = part.buckets[_US_PARTIAL], part.buckets[_PLAIN], part.buckets[_US_WHOLE]
        top = part.maxg + 1
        for f in range(g, top):
            b = partial[f] or plain[f]
            if b:
                return next(iter(b))
        for f in range(g, top):
            b = whole[f]
            if b:
                return next(iter(b))
        return None

    def pick(self, dom: Domain, n: int, g: int) -> list[Slot]:
        """Choose n nodes in ``dom``, spanning as few sub-domains as possible."""
        out: list[Slot] = []
        self._pick(dom, n, g, out)
        return out

    def _pick(self, dom: Domain, n: int, g: int, out: list[Slot]) -> None:
        subs = [s for s in dom.subs if s.cnt[g] > 0]
        # One sub-domain holds everything: best fit among those that do.
        fit = [s for s in subs if s.cnt[g] >= n]
        if fit:
            best = min(fit, key=lambda s: (s.cnt[g], s.free, s.order))
            self._pick(best, n, g, out)
            return
        bare = sorted((s for s in dom.bare if s.free >= g), key=lambda s: (s.free, s.order))
        take = bare[:n]
        out.extend(take)
        n -= len(take)
        if n <= 0:
            return
        # Largest sub-domains first (fewest spanned), remainder best-fit.
        subs.sort(key=lambda s: (-s.cnt[g], s.order))
        for i, s in enumerate(subs):
            rest = subs[i:]
            fit = [r for r in rest if r.cnt[g] >= n]
            if fit:
                best = min(fit, key=lambda r: (r.cnt[g], r.free, r.order))
                self._pick(best, n, g, out)
                return
            c = s.cnt[g]
            self._pick(s, c, g, out)
            n -= c
            if n <= 0:
                return

    def largest_block(self, part: Partition, g: int, max_level: int) -> tuple[int, str]:
        """Most nodes with >= g free GPUs inside one domain at ``max_level`` (for messages)."""
        if max_level >= AGENT_LEVEL:
            return part.root.cnt[g] if g <= part.maxg else 0, part.root.label
        best, label = 0, ""
        if g > part.maxg:
            return 0, ""
        for lvl in range(1, max_level + 1):
            for d in part.levels.get(lvl, ()):
                if d.cnt[g] > best:
                    best, label = d.cnt[g], d.label
        if best == 0 and part.root.cnt[g] > 0:
            return 1, part.root.label  # single nodes only
        return best, label


def _topo_sort_key(n: NodeInfo) -> tuple:
    return (n.zone, n.layer1, n.layer2, n.layer3, n.ultraserver, n.id)


_slot_order = attrgetter("order")
_topo_key = attrgetter("zone", "layer1", "layer2", "layer3", "ultraserver", "id")  # same tuple
