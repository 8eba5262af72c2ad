"""Submit-time checks for jobs that run users' code (and the built-in trainer's preset).

Why at submit: a bad command, a missing workdir or an unknown model otherwise fails
only after a placement, a launch and a process start, minutes later and far from the
person who typed it. Malformed input is INVALID_ARGUMENT; input that is fine but
cannot run on this broker as it stands (workdir never uploaded, no region with a
working checkpoint store) is FAILED_PRECONDITION.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from broker.api.errors import FailedPrecondition, InvalidArgument
from broker.auth.identity import Principal
from broker.workdirs.blobstore import DIGEST_RE, BlobStore
from broker.workdirs.service import may_use
from computebroker.v1 import agent_pb2 as apb
from computebroker.v1 import common_pb2 as pb

MAX_ARGS = 4096
MAX_RUN_BYTES = 128 * 1024  # the whole argv; Linux allows more, a typo'd paste deserves a no
ALLOWED_CONTROL = {"\n", "\t"}  # multi-line `run` scripts go to bash -c as one argument
# C0 controls and DEL except ALLOWED_CONTROL (one regex, not a Python loop per character:
# every SubmitJob passes here).
_BAD_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def model_presets() -> list[str]:
    """Names of the built-in trainer's model presets (trainer/config.py imports no torch)."""
    from trainer.config import MODEL_PRESETS

    return sorted(MODEL_PRESETS)


def check_run(argv: Iterable[str]) -> None:
    argv = list(argv)
    if len(argv) > MAX_ARGS:
        raise InvalidArgument(f"spec.command (run) has {len(argv)} arguments; at most {MAX_ARGS}")
    total = sum(len(a.encode()) for a in argv)
    if total > MAX_RUN_BYTES:
        raise InvalidArgument(
            f"spec.command (run) is {total} bytes; at most {MAX_RUN_BYTES}: put long scripts"
            " in a file in the workdir and run that")
    if not argv[0].strip():
        raise InvalidArgument("spec.command (run) starts with an empty program name")
    for i, a in enumerate(argv):
        m = _BAD_CONTROL.search(a)
        if m is not None:
            bad = m.group()
            raise InvalidArgument(
                f"spec.command (run) argument {i} contains the control character {bad!r};"
                " commands may hold newlines and tabs only")


def check_workdir(ref: pb.WorkdirRef, blobs: BlobStore, who: Principal | None = None,
                  team: str = "") -> None:
    """The workdir is stored and ``who`` (submitting for ``team``) may run it: its team
    uploaded it. Another team's digest reads exactly like one never uploaded, so a
    refusal tells nothing about what other teams run."""
    if not DIGEST_RE.match(ref.digest):
        raise InvalidArgument(
            f"spec.workdir.digest {ref.digest!r} is not of the form sha256:<64 lowercase hex>")
    size = blobs.size(ref.digest)
    if size is not None and not may_use(blobs, ref.digest, who, team):
        size = None
    if size is None:
        raise FailedPrecondition(
            f"workdir {ref.digest} was never uploaded to this broker; upload it first"
            " (the SDK and `brokerctl submit --workdir DIR` do)")
    if ref.size_bytes and ref.size_bytes != size:
        raise InvalidArgument(
            f"spec.workdir.size_bytes is {ref.size_bytes} but the stored workdir {ref.digest}"
            f" has {size} bytes")


def check_checkpoint_stores(spec: pb.JobSpec, agents: Iterable[apb.Register]) -> None:
    """Refuse a job that needs a region's own checkpoint store when every registered
    region reported its store broken (agents probe it at start, Register field 8)."""
    regs = list(agents)
    if spec.checkpoint_uri or not regs:
        return
    broken = [r for r in regs if r.checkpoint_store_error]
    # an outage is weather: the job is taken and waits for a store (pending reason)
    if len(broken) == len(regs) and not any(r.checkpoint_store_outage for r in broken):
        why = "; ".join(f"{r.region}: {r.checkpoint_store_error}" for r in broken[:5])
        raise FailedPrecondition(
            f"no registered region can write checkpoints ({why}); fix the stores or give"
            " spec.checkpoint_uri")


def broken_store_note(agents: Iterable[apb.Register]) -> str:
    """A pending reason's note naming regions excluded for a broken checkpoint store."""
    broken = [r for r in agents if r.checkpoint_store_error]
    return "; ".join(f"region {r.region} gets no jobs: its checkpoint store is "
                     + (f"unreachable since {_clock(r.checkpoint_store_error_since)}"
                        if r.checkpoint_store_outage and r.checkpoint_store_error_since
                        else "unreachable" if r.checkpoint_store_outage else "not writable")
                     + f" ({r.checkpoint_store_error})" for r in broken[:3])


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


def check_submit(spec: pb.JobSpec, blobs: BlobStore, agents: Iterable[apb.Register],
                 who: Principal | None = None) -> None:
    """All of the above, in the order a person would fix them."""
    if spec.command:
        check_run(spec.command)
    elif spec.trainer.model:
        known = model_presets()
        if spec.trainer.model not in known:
            raise InvalidArgument(
                f"spec.trainer.model {spec.trainer.model!r} is not a model preset of the built-in"
                f" trainer; known: {', '.join(known)} (or give a run command for your own code)")
    if spec.HasField("workdir"):
        check_workdir(spec.workdir, blobs, who, spec.team)
    check_checkpoint_stores(spec, agents)
