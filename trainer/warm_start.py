"""A warm rank starter (a "zygote"): an interpreter that has imported torch and the
trainer library once, and forks a rank of the job's next attempt when its agent asks.

Why: in a recovery the ranks of the relaunch start from nothing, and starting the
interpreter and importing torch was the largest stage of the downtime after the memory
tier made the restore itself short (docs/recovery.md "Where a recovery's time goes");
on a loaded machine it was most of it. A fork of a process that already holds those
modules starts a rank in milliseconds, as Android's zygote and forking servers do.

How (region_agents/executors/rank_zygotes.py is the other end): the agent starts one
per node of a job, as the job's own identity and with the job's environment (minus
the per-attempt variables), once an attempt runs; it talks over a SEQPACKET socket
passed as ``--fd``. A request carries the rank's argv (``python script.py ...`` or
``python -m module ...``), full environment, cwd, process group, exit file, and three
descriptors: the rank's stdout and stderr (opened by the agent, as for a spawned rank)
and the read end of a "go" pipe. The child blocks on that pipe until the agent has
made the rank's pid durable in its attempt record (attempt_records.py); if the agent
dies first the pipe closes and the child exits without running anything, so a rank
the agent cannot find after a restart never trains (no attempt runs twice).

The zygote reaps its children and writes each one's exit status to its exit file
(``CB_EXIT_FILE``: the agent is not their parent, so this is how it learns that a rank
was killed by a signal, e.g. -9) before the status is gone. It exits when the agent's
end of the socket closes; ranks already running go on (the agent's restart adopts them
from its records, as any rank).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import time
import traceback

from checkpoint_layout.held_signals import HELD_AT_START

MAX_REQUEST = 1 << 20  # argv + environment of one rank
READY = b'{"ready": true}'
READY_LINE = "warm rank starter ready"  # its log's line once its imports are done
REAP_S = 0.02  # how often the children's exits are looked for between requests


def preload() -> None:
    """What every rank imports before its first step: torch, its distributed and
    checkpoint packages, the trainer library, and what FSDP2's first ``fully_shard``
    and the first optimizer step import lazily (torch._dynamo with its compiler
    stack, torch.onnx: a quarter of a rank's imports, measured on the byo example).
    Imports only: nothing runs a tensor op here, so no thread pool exists to fork."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch._functorch.aot_autograd  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.onnx  # noqa: F401

    import trainer.checkpointer  # noqa: F401
    import trainer.memtier  # noqa: F401
    import trainer.run  # noqa: F401


def exit_status(code: int, si_code: int) -> int:
    """Popen's convention: the exit code, or minus the signal that killed it."""
    return code if si_code == os.CLD_EXITED else -code


def _write_exit(path: str, code: int) -> None:
    if not path:
        return
    with contextlib.suppress(OSError):
        tmp = f"{path}.zygote.tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{code}\n")
        os.replace(tmp, path)


def reap(children: dict[int, str]) -> None:
    """Each child that ended: its status to its exit file, *then* reap it (WNOWAIT), so
    the file is written before the agent can see the process gone."""
    for pid, exit_file in list(children.items()):
        try:
            res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            children.pop(pid)
            continue
        if res is None or res.si_pid == 0:
            continue
        _write_exit(exit_file, exit_status(res.si_status, res.si_code))
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        children.pop(pid)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_rank(argv: list[str]) -> int:
    """Run the rank's program as ``python argv[1:]`` would; its exit code."""
    try:
        if len(argv) >= 3 and argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path[0] = os.path.dirname(os.path.abspath(argv[1]))
            runpy.run_path(argv[1], run_name="__main__")
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the hook, exit 1
        sys.excepthook(*sys.exc_info())
        return 1


def child(req: dict, fds: list[int], sock: socket.socket) -> None:
    """In the forked child: become the rank, wait for the go, run, exit. Never returns."""
    code = 1
    try:
        sock.close()
        out, err, go = fds
        os.setpgid(0, int(req.get("pgid", 0)))
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (devnull, out, err):
            os.close(fd)
        got = os.read(go, 1)  # the agent has recorded this pid (or died: EOF)
        os.close(go)
        if got != b"g":
            os._exit(1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        code = run_rank(list(req["argv"]))
        with contextlib.suppress(Exception):
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads, as at exit
        with contextlib.suppress(Exception):
            import atexit

            atexit._run_exitfuncs()  # the trainer's exit path runs here (it may _exit itself)
    except BaseException:  # noqa: BLE001 - the child must never return into the loop
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Fork a rank per request until the agent's end closes."""
    children: dict[int, str] = {}
    sock.sendall(READY)
    while True:
        readable, _, _ = select.select([sock], [], [], REAP_S)
        reap(children)
        if not readable:
            continue
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 3)
        except OSError:
            return
        if not msg:
            return  # the agent is gone: running ranks go on, no new ones
        try:
            req = json.loads(msg)
            if len(fds) != 3:
                raise ValueError(f"expected 3 descriptors, got {len(fds)}")
        except ValueError as exc:
            for fd in fds:
                os.close(fd)
            sock.sendall(json.dumps({"error": str(exc)}).encode())
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(req, fds, sock)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # as the child does: the group exists on reply
            os.setpgid(pid, int(req.get("pgid", 0)) or pid)
        children[pid] = str(req.get("exit_file", ""))
        sock.sendall(json.dumps({"pid": pid}).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fd", type=int, required=True, help="the agent's SEQPACKET socket")
    args = ap.parse_args()
    sock = socket.socket(fileno=args.fd)
    # its ranks start with SIGUSR1 blocked, as a spawned rank does (a mask is inherited
    # over fork): an early checkpoint-now waits for the trainer's handler, never kills
    # (checkpoint_layout/held_signals.py); the starter itself never needs it
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_START)
    t0 = time.monotonic()
    print("warm rank starter: importing", flush=True)
    preload()
    print(f"{READY_LINE} (imports took {time.monotonic() - t0:.1f}s)", flush=True)
    serve(sock)


if __name__ == "__main__":
    main()
