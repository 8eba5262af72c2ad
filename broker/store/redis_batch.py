"""The Redis store's write group: concurrent writes share one pipeline and one ``WAIT``.

Why: every acknowledged Redis write used to be its own round trip and, with store HA
(``min_replicas``, docs/operator/store-ha.md), its own ``WAIT`` for the replicas. With
thousands of running attempts (progress, ends, heartbeats, audit records) that was
thousands of round trips and WAITs a second, each holding a pooled connection for a
replica round trip. Here the writes that queue while one group is on the wire go out
together: every member's commands (its fenced Lua script calls, unchanged) in one
pipeline on one connection, then ONE ``WAIT n ms`` for all of them. ``WAIT`` counts
the replication offset of the connection's last write, so one confirmation covers
every member before it in the pipeline.

What a member is told, decided in one place (:meth:`RedisWriteGroup._results`):

* the ``WAIT`` fell short (or failed): **every** member gets :class:`StoreUnavailable`,
  whatever its script answered. Its write may be on the primary only; nobody is told
  it happened, and every write is safe to retry (request tokens, client request ids).
  Never an acknowledgement a failover could take back. (Members that never waited for
  the replicas, rank log chunks, keep their own answer; a group of only such members
  sends no ``WAIT``.)
* otherwise each member alone: its own script's answer (a version conflict, a job not
  found, a fenced leader) becomes its own error, a Redis error reply to one of its
  commands is its own error, and the others are acknowledged. Each script is atomic
  on the server by itself, so a member failing writes nothing and disturbs nobody.
* the pipeline could not be sent or read (a connection lost, a failover): the store's
  bounded retry runs the whole group again (each script's token returns the first
  run's answer instead of applying twice), and past it every member is UNAVAILABLE.

Order: members go out in queue order on one connection, and Redis runs a connection's
commands in order, so two writes to one job in one group land as one after the other
would (the second's compare-and-set sees the first's version).

Scripts are called by ``EVALSHA``; a server that lacks one (a restart, a promoted
replica with an empty script cache) answers NOSCRIPT to those members only, which are
loaded and sent again in a second pipeline with its own ``WAIT`` (redis-py's own script
handling would instead ask ``SCRIPT EXISTS`` before every pipeline: a round trip a group).

The queueing is the shared group-commit machinery (broker/store/group_commit.py's
``GroupWriter``): a lone write goes out at once, groups form only while a write is in
flight, nothing waits on a timer. This module is only what is Redis about a group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
from redis.commands.core import Script

from broker.store.base import StoreUnavailable
from broker.store.group_commit import GroupWriter

Command = tuple[object, ...]


Plan = Callable[[list[object], dict], list[Command]]


@dataclass(slots=True)
class Write:
    """One member of a group: its commands (sent in order, one after the other) and how
    their replies become its result. ``finish`` raises the member's own error (a
    StoreError such as VersionConflict) or returns what its caller gets.

    ``confirm``: whether the member's acknowledgement waits for the replicas (False for
    rank log lines, which agents re-send from their offsets: they never did).

    A member that must read before it knows what to write (a log chunk: which of its
    lines are new) gives ``reads`` and ``plan`` instead of ``commands``: every such
    member's reads go out first, in one pipeline for the whole group, and ``plan`` turns
    its replies into its commands, in queue order, with a dict the group's plans share
    (what an earlier member of the group will have written when a later one's runs)."""

    commands: list[Command]
    finish: Callable[[list[object]], object]
    confirm: bool = True
    reads: list[Command] = field(default_factory=list)
    plan: Plan | None = None


def script_call(script: Script, args: Sequence[object], keys: Sequence[str] = ()) -> Command:
    """``EVALSHA`` of a registered script: the command a :class:`Write` carries."""
    return ("EVALSHA", script.sha, len(keys), *keys, *args)


def _no_script(reply: object) -> bool:
    return isinstance(reply, redis.exceptions.NoScriptError)


class RedisWriteGroup:
    """``submit(write)``: the member's result, once the group it rode in is on the server
    and (when ``needed()`` asks for replicas) confirmed by them."""

    def __init__(
        self,
        client: redis.Redis,
        call: Callable[[Callable[[], list[object]]], list[object]],
        needed: Callable[[], int],
        wait_ms: int,
        scripts: Sequence[Script],
        on_short: Callable[[], None] = lambda: None,
    ) -> None:
        """``call`` runs a function under the store's bounded retry (transient errors;
        StoreUnavailable past it); ``needed`` is how many replicas the next group waits
        for (0: none); ``on_short`` hears a WAIT that fell short (the quorum asks the
        Sentinels again); ``scripts`` are loaded after a NOSCRIPT."""
        self._client = client
        self._call = call
        self._needed = needed
        self._wait_ms = wait_ms
        self._scripts = {s.sha: s.script for s in scripts}
        self._on_short = on_short
        self._writer: GroupWriter[Write, object] = GroupWriter(self._write_group)
        self.waits = 0  # WAIT commands sent (tests and the store's closing log line)

    @property
    def groups(self) -> int:
        """Pipelines written (one WAIT each when replicas confirm)."""
        return self._writer.groups

    @property
    def members(self) -> int:
        return self._writer.members

    def submit(self, write: Write) -> object:
        return self._writer.submit(write)

    def close(self) -> None:
        """Let the group writer's thread end, where the group-commit machinery has one to
        end (``GroupWriter.close``); without one there is nothing to stop."""
        stop = getattr(self._writer, "close", None)
        if stop is not None:
            stop()

    # ---- one group -----------------------------------------------------------------
    def _write_group(self, group: list[Write]) -> list[object]:
        needed = self._needed()
        replies, acks = self._call(lambda: self._send(group, needed))  # type: ignore[arg-type, misc]
        return self._results(group, replies, needed, acks)

    def _plan(self, group: list[Write]) -> list[list[Command]]:
        """Each member's commands: its own, or (members with reads) what its plan makes
        of its reads' replies, all reads in one pipeline. Run on every try of the group:
        a retry plans afresh from what the server holds then."""
        if not any(w.reads for w in group):
            return [w.commands for w in group]
        pipe = self._client.pipeline(transaction=False)
        for w in group:
            for cmd in w.reads:
                pipe.execute_command(*cmd)
        out = pipe.execute(raise_on_error=True)
        shared: dict = {}
        commands: list[list[Command]] = []
        at = 0
        for w in group:
            n = len(w.reads)
            commands.append(w.plan(out[at:at + n], shared) if w.plan is not None else w.commands)
            at += n
        return commands

    def _send(self, group: list[Write], needed: int) -> tuple[list[list[object]], int]:
        """Every member's commands and one WAIT, in one pipeline; members that met a
        NOSCRIPT again after loading the scripts. Returns each member's replies and the
        fewest confirmations any pipeline got (``needed`` when none was asked). No WAIT
        for a group with no member to confirm."""
        commands = self._plan(group)
        if not any(w.confirm for w in group):
            needed = 0
        replies: list[list[object]] = [[] for _ in group]
        todo = list(range(len(group)))
        acks = needed
        for attempt in range(2):
            pipe = self._client.pipeline(transaction=False)
            for i in todo:
                for cmd in commands[i]:
                    pipe.execute_command(*cmd)
            if needed:
                pipe.execute_command("WAIT", needed, self._wait_ms)
                self.waits += 1
            out = pipe.execute(raise_on_error=False)
            if needed:
                got = out.pop()
                acks = min(acks, got if isinstance(got, int) else -1)
            at = 0
            for i in todo:
                n = len(commands[i])
                replies[i] = out[at:at + n]
                at += n
            todo = [i for i in todo if any(_no_script(r) for r in replies[i])]
            if not todo or attempt:
                break
            for body in self._scripts.values():
                self._client.script_load(body)
        return replies, acks

    def _results(self, group: list[Write], replies: list[list[object]], needed: int,
                 acks: int) -> list[object]:
        """What each member is told (the rules in the module docstring)."""
        short = bool(needed) and acks < needed and any(w.confirm for w in group)
        if short:
            self._on_short()
        shown = "no answer" if acks < 0 else f"{acks} of {needed}"
        out: list[object] = []
        for write, mine in zip(group, replies, strict=True):
            if short and write.confirm:
                out.append(StoreUnavailable(
                    f"state store replica did not confirm the write ({shown} within "
                    f"{self._wait_ms} ms); not acknowledged, retry later"))
                continue
            failed = next((r for r in mine if isinstance(r, BaseException)), None)
            if failed is not None:
                out.append(failed)
                continue
            try:
                out.append(write.finish(mine))
            except Exception as e:  # noqa: BLE001 - this member's own error, the others stand
                out.append(e)
        return out
