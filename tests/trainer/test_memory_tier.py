"""The in-memory recovery tier with real processes: keepers, gloo ranks, a node killed.

Three "nodes", one rank each (examples/byo/train_plain.py, FSDP2 over 3 ranks), each node
with its own keeper process (trainer/memkeeper.py); snapshots every step, durable
checkpoints every 5 steps. Node 1 is killed (its rank and its keeper, SIGKILL) mid-run;
the gang is relaunched on the survivors plus a spare node with an empty keeper:

* rank 1's shard comes from its buddy's keeper (node 2), the others' from their own;
  the resume loses at most one step, is newer than the newest durable checkpoint, and
  every step's samples and loss equal an uninterrupted 3-rank run;
* when both copies of a shard are gone (node 1's and node 2's keepers killed), every rank
  falls back to the newest durable checkpoint, and the progress file says which tier;
* each keeper holds at most 2 steps of each rank it serves (bounded memory);
* a node lost while a snapshot is half-sent, with one node's link so slow that its
  ranks' sends take several steps: every rank took and skipped the same snapshots, so
  the relaunch resumes from the newest snapshot every rank completed (the one before the
  half-sent one), never from the durable checkpoint and never from a mix of steps;
* with no spare, the gang shrinks to the 2 survivors: their ranks read the 3 old shards
  from the keepers (node 1's from its buddy copy on node 2) and DCP reshards them
  3 -> 2; at most one step lost, then every step's samples and loss equal the
  uninterrupted 3-rank run.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.launch import REPO, Run, launch, read_log
from tests.trainer.test_library_example import wait_codes
from tests.trainer.test_trainer_processes import assert_matches
from trainer.memkeeper import KEEP, TOKEN_ENV
from trainer.memtier import PREFIX, KeeperClient, head_length, load_head, newest_complete

pytestmark = pytest.mark.slow
SCRIPT = str(REPO / "examples" / "byo" / "train_plain.py")
STEPS, NODES, TOKEN = 24, 3, "test-token"


class Keeper:
    """One node's keeper process, on an ephemeral loopback port."""

    def __init__(self, tmp: Path, name: str) -> None:
        port_file = tmp / f"keeper-{name}.port"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.memkeeper", "--port-file", str(port_file)],
            env={**os.environ, TOKEN_ENV: TOKEN, "PYTHONPATH": str(REPO)}, cwd=REPO)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "keeper did not start"
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text()}"

    def stats(self) -> dict[str, Any]:
        return KeeperClient(self.address, TOKEN).request({"op": "stats"})[0]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def keepers(tmp_path: Path):
    started: list[Keeper] = []

    def start(name: str) -> Keeper:
        started.append(Keeper(tmp_path, name))
        return started[-1]

    yield start
    for k in started:
        if k.proc.poll() is None:
            k.kill()


def run_job(workdir: Path, ckpt: Path, log: Path, keepers: list[Keeper] | None, *,
            attempt: int, sleep: float, nodes: int = NODES, checkpoint_every: int = 5,
            hsdp: bool = False) -> Run:
    """`hsdp`: each rank says it is its node's only one (LOCAL_WORLD_SIZE=1), as a job
    with one rank per node does, so the library's layout is HSDP: every rank holds the
    whole model, a replica of the others."""
    argv = [SCRIPT, "--steps", str(STEPS), "--checkpoint-every", str(checkpoint_every),
            "--loss-log", str(log),
            "--step-sleep", str(sleep), "--seed", "4"]
    env = {}
    if keepers is not None:
        env = {"CB_MEMORY_EVERY": "1", "CB_MEMORY_KEEPERS": ",".join(k.address for k in keepers),
               TOKEN_ENV: TOKEN}
    return launch(workdir, nodes, "{}", str(ckpt), attempt=attempt, argv=argv, job_id="j-mem",
                  env=env, rank_env={r: {"NODE_RANK": str(r),
                                         **({"LOCAL_WORLD_SIZE": "1"} if hsdp else {})}
                                     for r in range(nodes)})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    d = tmp_path_factory.mktemp("mem-ref")
    run = run_job(d / "run", d / "ckpt", d / "loss.jsonl", None, attempt=0, sleep=0.0)
    wait_codes(run, 0)
    return read_log(d / "loss.jsonl")


def kill_node_mid_run(tmp: Path, ckpt: Path, log: Path, ks: list[Keeper],
                      lost: list[int]) -> int:
    """Attempt 1 until step 12, then node 1's rank and the keepers in `lost` die (SIGKILL)
    and the agent kills the rest of the gang; returns the last step rank 0 logged."""
    a1 = run_job(tmp / "a1", ckpt, log, ks, attempt=1, sleep=0.25)
    deadline = time.monotonic() + 180
    while not (log.exists() and len(read_log(log)) >= 12):
        assert time.monotonic() < deadline and all(p.poll() is None for p in a1.procs), a1.output()
        time.sleep(0.05)
    a1.procs[1].send_signal(signal.SIGKILL)
    for i in lost:
        ks[i].kill()
    time.sleep(0.5)
    a1.kill()
    return read_log(log)[-1]["step"]


def final_records(log: Path) -> list[dict[str, Any]]:
    """The last record of each step (steps after the resume point were retrained)."""
    by_step = {r["step"]: r for r in read_log(log)}
    return [by_step[s] for s in sorted(by_step)]


def test_a_killed_node_is_replaced_and_restored_from_peer_memory(
    tmp_path: Path, keepers, reference: list[dict[str, Any]]
) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "loss.jsonl"
    ks = [keepers(f"n{i}") for i in range(NODES)]
    last = kill_node_mid_run(tmp_path, ckpt, log, ks, lost=[1])
    for k in (ks[0], ks[2]):  # bounded: KEEP steps of the own rank and of the ward
        assert k.stats()["snapshots"] <= 2 * KEEP

    spare = keepers("spare")
    a2 = run_job(tmp_path / "a2", ckpt, log, [ks[0], spare, ks[2]], attempt=2, sleep=0.0)
    wait_codes(a2, 0)
    prog = a2.progress()
    assert prog["state"] == "done" and prog["resume_tier"] == "memory", prog
    resumed = prog["resumed_step"]
    assert last - 1 <= resumed <= last, f"lost {last - resumed} steps (last logged {last})"
    # Memory use is reported: rank 0's snapshot size and what its keepers hold, bounded.
    mem = prog["memory_tier"]
    assert mem["every"] == 1 and mem["taken"] >= 1 and mem["failed"] == 0
    assert mem["snapshot_bytes"] > 0 and len(mem["keeper_bytes"]) == 2  # own node's and buddy's
    # each keeper: KEEP steps of 2 ranks (shards differ a little in size across ranks)
    assert 0 < max(mem["keeper_bytes"].values()) <= 2 * KEEP * mem["snapshot_bytes"] * 1.5
    durable = int(re.search(r"newest durable checkpoint: step (\d+)", a2.output(0)).group(1))
    assert 0 < durable < resumed, "the memory tier must have saved steps the store lacks"
    assert prog["restored_from_peer"] == [1]  # the lost node's rank; the others from their own
    assert "shards of ranks [1] from another node's keeper" in a2.output(0)
    records = final_records(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_matches(reference, records, exact=False)


def test_both_copies_lost_falls_back_to_the_durable_checkpoint(
    tmp_path: Path, keepers, reference: list[dict[str, Any]]
) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "loss.jsonl"
    ks = [keepers(f"n{i}") for i in range(NODES)]
    kill_node_mid_run(tmp_path, ckpt, log, ks, lost=[1, 2])  # rank 1's own and buddy copy
    a2 = run_job(tmp_path / "a2", ckpt, log, [ks[0], keepers("s1"), keepers("s2")], attempt=2,
                 sleep=0.0)
    wait_codes(a2, 0)
    prog = a2.progress()
    assert prog["resume_tier"] == "store", prog
    assert "resuming from the store" in a2.output(0)
    records = final_records(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_matches(reference, records, exact=False)


def test_no_spare_the_survivors_reshard_from_memory(
    tmp_path: Path, keepers, reference: list[dict[str, Any]]
) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "loss.jsonl"
    ks = [keepers(f"n{i}") for i in range(NODES)]
    last = kill_node_mid_run(tmp_path, ckpt, log, ks, lost=[1])
    a2 = run_job(tmp_path / "a2", ckpt, log, [ks[0], ks[2]], attempt=2, sleep=0.0, nodes=2)
    wait_codes(a2, 0)
    prog = a2.progress()
    assert prog["state"] == "done" and prog["resume_tier"] == "memory", (prog, a2.output())
    assert prog["resumed_from_world_size"] == 3 and prog["world_size"] == 2, prog
    resumed = prog["resumed_step"]
    assert last - 1 <= resumed <= last, f"lost {last - resumed} steps (last logged {last})"
    durable = int(re.search(r"newest durable checkpoint: step (\d+)", a2.output(0)).group(1))
    assert 0 < durable < resumed, "the memory tier must have saved steps the store lacks"
    assert "resharded from 3 ranks to 2" in a2.output(0)
    # old rank 1's shard survives only as node 2's buddy copy: a new rank read it there
    assert prog["restored_from_peer"], prog
    records = final_records(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert {r["world_size"] for r in records if r["step"] > resumed} == {2}
    assert_matches(reference, records, exact=False)
    # the survivors' keepers now hold the 2-rank run's steps; the old rank 2's are gone
    for k in (ks[0], ks[2]):
        index = KeeperClient(k.address, TOKEN).request({"op": "index", "job": "j-mem"})[0]
        assert set(index["ranks"]) <= {"0", "1"}, index


class SlowLink:
    """A TCP proxy in front of one node's keeper: a slow network to that node. It
    forwards every message as is, but holds each put half-sent for `hold` seconds
    (`half_sent` is set meanwhile), and drops the rest when the sender died in between
    (a node lost mid-send: the keeper sees the connection close mid-message)."""

    def __init__(self, target: str, hold: float) -> None:
        host, _, port = target.rpartition(":")
        self.target, self.hold = (host, int(port)), hold
        self.half_sent = threading.Event()
        self.held = 0  # puts held so far
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._conns: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            t = threading.Thread(target=self._pipe, args=(client,), daemon=True)
            self._conns.append(t)
            t.start()

    @staticmethod
    def _exact(sock: socket.socket, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(min(1 << 20, n - len(buf)))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return bytes(buf)

    def _pipe(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)

        def back() -> None:  # the keeper's replies, verbatim
            try:
                while data := upstream.recv(1 << 16):
                    client.sendall(data)
            except OSError:
                pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while True:
                prefix = self._exact(client, 4)
                head = self._exact(client, int.from_bytes(prefix, "big"))
                header = json.loads(head)
                payload = self._exact(client, int(header.get("size", 0)))
                upstream.sendall(prefix + head)
                if header.get("op") != "put" or not payload:
                    upstream.sendall(payload)
                    continue
                half = len(payload) // 2
                upstream.sendall(payload[:half])
                self.held += 1
                self.half_sent.set()
                time.sleep(self.hold)
                self.half_sent.clear()
                readable, _, _ = select.select([client], [], [], 0)
                if readable and not client.recv(1, socket.MSG_PEEK):
                    return  # the sender is gone: the rest never arrives
                upstream.sendall(payload[half:])
        except OSError:
            pass
        finally:
            upstream.close()
            client.close()

    def close(self) -> None:
        self._server.close()
        for t in self._conns:
            t.join(timeout=10)


def test_a_node_lost_mid_snapshot_resumes_from_the_newest_set_every_rank_completed(
    tmp_path: Path, keepers, reference: list[dict[str, Any]]
) -> None:
    """Node 1's link is slow (each put held 0.8 s, several steps): its rank's own sends
    and rank 0's buddy sends outlast steps, rank 2's do not. The ranks agree on which
    snapshots to skip, so the keepers hold the same steps of every rank; the whole gang
    dies while a put is half-sent, and the relaunch resumes from the snapshot before it
    (no durable checkpoint exists: the store would start at step 0). One rank per node
    (HSDP, 3 replicas): each rank's snapshot holds a third of the state, so the restore
    reads every rank's state from all three snapshots."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "loss.jsonl"
    ks = [keepers(f"n{i}") for i in range(NODES)]
    slow = SlowLink(ks[1].address, hold=0.8)
    try:
        a1 = run_job(tmp_path / "a1", ckpt, log, [ks[0], slow, ks[2]], attempt=1, sleep=0.1,
                     checkpoint_every=1000, hsdp=True)
        deadline = time.monotonic() + 180
        while not (slow.held >= 3 and slow.half_sent.is_set()):
            assert time.monotonic() < deadline and all(p.poll() is None for p in a1.procs), \
                a1.output()
            time.sleep(0.005)
        a1.kill()  # every rank at once, a put half-sent
    finally:
        slow.close()
    last = read_log(log)[-1]["step"]
    views: dict[int, set[int]] = {}  # old rank -> steps held on any keeper
    for k in ks:
        assert k.stats()["snapshots"] <= 2 * KEEP  # bounded: KEEP of the own rank and the ward's
        index = KeeperClient(k.address, TOKEN).request({"op": "index", "job": "j-mem"})[0]
        for rank, steps in index["ranks"].items():
            views.setdefault(int(rank), set()).update(int(s) for s in steps)
    held = {(r, s, NODES) for r, steps in views.items() for s in steps}
    complete = newest_complete([held], 1)
    assert complete is not None, f"no step every rank holds: {views}"
    step = complete[0]
    # Agreed skips: past the newest complete step, only the half-sent one exists anywhere.
    newer = {s for steps in views.values() for s in steps if s > step}
    assert len(newer) <= 1, f"ranks hold different steps: {views}"
    assert 0 < step < last, (step, last, views)
    # HSDP: the three replicas' snapshots of a step hold the state (parameters and AdamW's
    # two moments) once between them, not once each
    sys.path.insert(0, str(Path(SCRIPT).parent))
    from train_plain import MLP

    state = sum(p.numel() * p.element_size() for p in MLP().parameters()) * 3
    held_bytes = 0
    for rank in range(NODES):
        keeper = next(k for k in ks if str(step) in KeeperClient(k.address, TOKEN).request(
            {"op": "index", "job": "j-mem"})[0]["ranks"].get(str(rank), {}))
        c = KeeperClient(keeper.address, TOKEN)
        prefix = c.request({"op": "get", "job": "j-mem", "rank": rank, "step": step,
                            "ranges": [[0, PREFIX]]})[1]
        head = c.request({"op": "get", "job": "j-mem", "rank": rank, "step": step,
                          "ranges": [[PREFIX, head_length(prefix)]]})[1]
        held_bytes += sum(t[3] for t in load_head(head)["tensors"])
    assert state <= held_bytes <= state * 1.02, (state, held_bytes)

    a2 = run_job(tmp_path / "a2", ckpt, log, ks, attempt=2, sleep=0.0, checkpoint_every=1000,
                 hsdp=True)
    wait_codes(a2, 0)
    prog = a2.progress()
    assert prog["resume_tier"] == "memory" and prog["resumed_step"] == step, (prog, views)
    # every rank's own part was on its own node's keeper (none was lost)
    assert prog["resumed_from_world_size"] == NODES and prog["restored_from_peer"] == [], prog
    records = final_records(log)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert_matches(reference, records, exact=False)
