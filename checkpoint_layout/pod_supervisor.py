"""A trainer pod's main process: starts the pod's ranks, passes signals on, exits with
the code that tells the truth, publishes progress on the pod, and turns the agent's
checkpoint-now into SIGUSR1.

    python -m checkpoint_layout.pod_supervisor --ranks N -- python -m trainer
    python -m checkpoint_layout.pod_supervisor --ranks 0 -- CMD...   (a job's own command, once)

Why not torchrun as the container's main process: torchrun collapses its workers' exit
codes (a worker's exit 75 after a checkpoint-first stop becomes torchrun's 1, or its own
death by the SIGTERM), so the kubelet would never report 75 and no stop could end
CHECKPOINTED. This launcher does what the local executor does on a host: one process per
rank with ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_*`` (static rendezvous: pod 0's
headless-Service name), the whole pod stopped when one rank crashes, and an exit code
aggregated the local executor's way: the crash the shared blame rule picks
(checkpoint_layout/crash_blame.py), else 75 if any rank checkpointed, else 0.

* **Signals**: the kubelet's SIGTERM (a Stop) and SIGUSR1 are passed to every rank. (In
  the tests' node fixture the kubelet signals the whole process group, so ranks may get a
  SIGTERM twice: the trainer's handler only sets a flag.)
* **Progress out**: node rank 0's rank 0 writes the progress file (``CB_PROGRESS_FILE``,
  contract 2) in the pod's emptyDir, as under the local agent. A thread here copies it
  into the pod's annotation ``computebroker.io/progress`` with one merge PATCH: at once
  when the state, step or checkpoint changed (at most every ``MIN_S``), else with each
  new heartbeat at most every ``HEARTBEAT_S``. The agent's existing pod watch delivers
  it: no extra connection, nothing the agent must expose. One pod per attempt publishes.
  The trainer service account may patch pods; an admission policy in deploy/k8s lets a
  trainer token change only that annotation of its *own* pod (docs/kubernetes.md).
* **Output out**: each rank's stdout and stderr go through a pipe to this process,
  which writes every line to its own stdout with the rank's prefix
  (:mod:`checkpoint_layout.rank_lines`: ``[rank 3] ...``, ``[rank 3 stderr] ...``).
  The container log (``kubectl logs``) thus says which rank spoke, and the agent, which
  reads it through the API server's ``pods/log``, ships each rank's lines as that
  rank's (docs/kubernetes.md "Rank output"). With ``--ranks 0`` (a job's own command,
  once per pod) the prefix carries the pod's node rank.
* **Checkpoint-now in**: the agent sets the annotation ``computebroker.io/checkpoint-now``
  to a new value; the kubelet refreshes the pod's downward-API file
  (``CB_PODINFO_DIR/checkpoint-now``) and this process SIGUSR1s the ranks. A value
  present when this process starts is a request too (made while the pod was starting).
  The ranks start with SIGUSR1 blocked (checkpoint_layout/held_signals.py): one that
  comes before the trainer's handler is in waits for it instead of killing the rank.
* **Users' code**: with ``CB_WORKDIR_URI`` set, before any rank starts, the job's workdir
  is fetched from the job's checkpoint store, its size and sha256 checked, and unpacked
  into ``<CB_WORK_DIR>/workdir``, the ranks' cwd (checkpoint_layout/workdir_store.py
  says why there). If that fails nothing starts: the reason goes to the container's
  termination message (``TERMINATION_LOG``, which the kubelet reports in the pod's
  status and the agent passes on) and the pod exits ``EXIT_WORKDIR_REFUSED``, or
  ``EXIT_STORE_UNAVAILABLE`` when the store could not be reached (the broker waits).

Standard library only (boto3 only for a workdir in S3): it runs in the trainer's image.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from checkpoint_layout import rank_lines
from checkpoint_layout.crash_blame import culprit
from checkpoint_layout.faults import EXIT_STORE_UNAVAILABLE
from checkpoint_layout.held_signals import held_for_children
from checkpoint_layout.pod_deadline import POD_NAME_ENV, POD_NAMESPACE_ENV, SA_DIR
from checkpoint_layout.workdir_store import EXIT_WORKDIR_REFUSED, URI_ENV

PROGRESS_ANNOTATION = "computebroker.io/progress"
CHECKPOINT_NOW_ANNOTATION = "computebroker.io/checkpoint-now"
PODINFO_ENV = "CB_PODINFO_DIR"
MIN_S = 2.0  # at most one PATCH per this for a change
HEARTBEAT_S = 10.0  # and one per this for a heartbeat alone (the hang detector's input)
TICK_S = 0.25
LINE_MAX = 64 * 1024  # a longer line is copied in pieces, each prefixed
DRAIN_S = 10.0  # after the ranks ended, wait this long for their last output
EXIT_OK, EXIT_CHECKPOINTED = 0, 75
# The container's terminationMessagePath (k8s_manifests.py sets it): a file in the pod's
# own emptyDir, not the default /dev/termination-log, so that the tests' node fixture
# can provide it without covering the host's /dev. Kubernetes keeps at most 4096 bytes.
TERMINATION_LOG = "/var/run/computebroker/termination-log"
TERMINATION_MAX = 4096


def aggregate(codes: list[int]) -> int:
    """The pod's exit code from its ranks' (in rank order), as the local executor
    judges a gang: the first crash, else 75 if any rank checkpointed, else 0."""
    bad = [c for c in codes if c not in (EXIT_OK, EXIT_CHECKPOINTED)]
    if bad:
        return bad[0]
    return EXIT_CHECKPOINTED if EXIT_CHECKPOINTED in codes else EXIT_OK


def _code(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc  # killed by signal N: 128+N, as a shell says


class Publisher:
    """PATCHes one annotation of the own pod through the in-cluster API."""

    def __init__(self, api: str, namespace: str, name: str, token: str, ca: str | None) -> None:
        self.url = f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{name}"
        self.token = token
        self.ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()

    @classmethod
    def from_env(cls) -> Publisher | None:
        name, ns = os.environ.get(POD_NAME_ENV, ""), os.environ.get(POD_NAMESPACE_ENV, "")
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not (name and ns and host and port):
            return None
        try:
            token = (SA_DIR / "token").read_text().strip()
        except OSError as e:
            print(f"pod_supervisor: no service-account token, progress not published: {e}",
                  file=sys.stderr)
            return None
        ca = SA_DIR / "ca.crt"
        return cls(f"https://{host}:{port}", ns, name, token, str(ca) if ca.exists() else None)

    def publish(self, annotation: str, value: str) -> None:
        body = json.dumps({"metadata": {"annotations": {annotation: value}}}).encode()
        req = urllib.request.Request(self.url, data=body, method="PATCH", headers={
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/merge-patch+json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=5) as r:
            r.read()


def publish_loop(pub: Publisher, path: str, stop: threading.Event) -> None:
    """Copy the progress file into the pod annotation (see the module doc)."""
    last_sig: tuple | None = None
    last_pub, last_text = 0.0, ""
    while True:
        # When the ranks have ended, one last publish of whatever changed, unthrottled:
        # the final step and checkpoint must reach the agent before the pod is gone.
        final = stop.wait(TICK_S * 2)
        text = _read(Path(path))
        if not text or text == last_text:
            if final:
                return
            continue
        try:
            data = json.loads(text)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        sig = (data.get("state"), data.get("step"), data.get("last_checkpoint_step"),
               data.get("last_checkpoint_uri"))
        now = time.monotonic()
        if final or (sig != last_sig and now - last_pub >= MIN_S) or now - last_pub >= HEARTBEAT_S:
            try:
                pub.publish(PROGRESS_ANNOTATION, json.dumps(data, sort_keys=True,
                                                            separators=(",", ":")))
                last_sig, last_pub, last_text = sig, now, text
            except Exception as e:  # noqa: BLE001 - retried on the next tick
                print(f"pod_supervisor: progress not published: {e}", file=sys.stderr)
        if final:
            return


class Output:
    """Copies the ranks' pipes to this process's stdout, one whole prefixed line per
    write (a lock keeps two ranks' lines from interleaving mid-line)."""

    def __init__(self, fd: int = 1) -> None:
        self.fd = fd
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def write(self, rank: int, stream: str, line: bytes) -> None:
        data = rank_lines.prefix(rank, stream) + line + (b"" if line.endswith(b"\n") else b"\n")
        with self.lock:
            view = memoryview(data)
            while view:
                try:
                    n = os.write(self.fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    return  # our stdout is gone (the container is ending): nothing to tell
                view = view[n:]

    def copy(self, rank: int, stream: str, pipe) -> None:  # noqa: ANN001 - a binary file
        def run() -> None:
            with pipe:
                for line in iter(lambda: pipe.readline(LINE_MAX), b""):
                    self.write(rank, stream, line)
        t = threading.Thread(target=run, daemon=True, name=f"out-{rank}-{stream}")
        t.start()
        self.threads.append(t)

    def say(self, rank: int, message: str) -> None:
        """The supervisor's own word, on the pod's first rank's stderr."""
        self.write(rank, rank_lines.STDERR, f"pod_supervisor: {message}".encode())

    def drain(self, timeout: float) -> None:
        """Wait for the ranks' last lines (a rank's child may keep a pipe open: bounded)."""
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


def rank_env(base: dict[str, str], ranks: int, local: int) -> dict[str, str]:
    node_rank = int(base.get("NODE_RANK") or 0)
    env = dict(base)
    env.update(RANK=str(node_rank * ranks + local), LOCAL_RANK=str(local),
               LOCAL_WORLD_SIZE=str(ranks), GROUP_RANK=str(node_rank), NODE_RANK=str(node_rank))
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m checkpoint_layout.pod_supervisor")
    p.add_argument("--ranks", type=int, default=1,
                   help="processes to start (0: the command once, with the env as is)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command")
    base = dict(os.environ)
    cwd = _workdir(base)
    if isinstance(cwd, int):
        return cwd
    if cwd:  # the image's own modules (its working directory's) stay importable, after
        # the user's code, as the local executor puts the library on PYTHONPATH
        base["PYTHONPATH"] = os.pathsep.join(p for p in (base.get("PYTHONPATH"), os.getcwd()) if p)
    envs = [base] if args.ranks <= 0 else [rank_env(base, args.ranks, i) for i in range(args.ranks)]
    procs: list[subprocess.Popen] = []
    terminating = threading.Event()

    def forward(sig: int, frame: object) -> None:
        if sig == signal.SIGTERM:
            terminating.set()
        for pr in procs:
            if pr.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    pr.send_signal(sig)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(s, forward)
    out = Output()
    node_rank = int(base.get("NODE_RANK") or 0)
    first = node_rank * args.ranks if args.ranks > 0 else node_rank
    for env in envs:
        rank = int(env.get("RANK", first)) if args.ranks > 0 else first
        try:
            with held_for_children():  # SIGUSR1 pending until the trainer's handler is in
                pr = subprocess.Popen(command, env=env, cwd=cwd or None, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        except OSError as e:
            out.say(first, f"cannot start {command[0]!r}: {e}")
            for pr in procs:
                pr.kill()
            return 127
        procs.append(pr)
        out.copy(rank, rank_lines.STDOUT, pr.stdout)
        out.copy(rank, rank_lines.STDERR, pr.stderr)
    stop = threading.Event()
    pub = Publisher.from_env()
    progress = os.environ.get("CB_PROGRESS_FILE", "")
    publisher: threading.Thread | None = None
    if pub is not None and progress:
        publisher = threading.Thread(target=publish_loop, args=(pub, progress, stop), daemon=True)
        publisher.start()
    podinfo = os.environ.get(PODINFO_ENV, "")
    ckpt_file = Path(podinfo, "checkpoint-now") if podinfo else None
    # A value already there was set since this attempt's pod was made (the agent annotates
    # its pods once they exist): a request made while the pod started, to pass on now.
    seen = ""
    killed: set[int] = set()  # ranks (indexes) this process SIGKILLed after a crash
    while [pr.poll() for pr in procs].count(None):  # polls every rank (any() would stop early)
        time.sleep(TICK_S)
        value = _read(ckpt_file)
        if value and value != seen:
            seen = value
            forward(signal.SIGUSR1, None)
        crashed = [pr for pr in procs if pr.returncode not in (None, EXIT_OK, EXIT_CHECKPOINTED)]
        if crashed and not killed and not terminating.is_set():
            # one rank is gone: the others would wait in a collective forever
            for i, pr in enumerate(procs):
                if pr.poll() is None:
                    killed.add(i)
                    pr.kill()
    out.drain(DRAIN_S)
    stop.set()
    if publisher is not None:
        publisher.join(timeout=10)  # the final progress, before the pod's end is seen
    return pod_code([pr.returncode for pr in procs], killed)


def pod_code(returncodes: list[int], killed: set[int]) -> int:
    """The pod's exit code from its ranks' Popen return codes (in rank order).

    Ranks this process SIGKILLed after a crash (``killed``, by index) do not count: the
    crash's code is the pod's. Of several crashes, the one the shared rule blames
    (checkpoint_layout/crash_blame.py: a rank killed from outside, e.g. by the OOM
    killer, before a peer that then failed its collective), so that the agent, applying
    the same rule across pods, blames the right node. Without a crash, as ``aggregate``."""
    codes = [_code(rc) for rc in returncodes]
    crashes = [i for i, c in enumerate(codes)
               if i not in killed and c not in (EXIT_OK, EXIT_CHECKPOINTED)]
    if crashes:
        return codes[culprit(crashes, code=lambda i: codes[i], order=lambda i: i)]
    return aggregate(codes)


def _workdir(env: dict[str, str]) -> str | int | None:
    """The ranks' cwd: the unpacked workdir, or None without one; when it was refused,
    the pod's exit code (said on stderr and in the termination message):
    EXIT_STORE_UNAVAILABLE if the store could not be reached, else EXIT_WORKDIR_REFUSED."""
    if not env.get(URI_ENV):
        return None
    from checkpoint_layout.workdir_store import WorkdirRefused, prepare_from_env

    try:
        return prepare_from_env(env)
    except WorkdirRefused as e:
        why = f"workdir {'not fetched, the store is unreachable' if e.outage else 'refused'}: {e}"
        print(f"pod_supervisor: {why}", file=sys.stderr)
        with contextlib.suppress(OSError), open(TERMINATION_LOG, "w") as f:
            f.write(why[:TERMINATION_MAX])
        return EXIT_STORE_UNAVAILABLE if e.outage else EXIT_WORKDIR_REFUSED


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
