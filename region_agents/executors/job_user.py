"""Which Unix user a job's ranks run as (local executor), and the policy choosing it.

Why: a job is arbitrary code from whoever can submit. Before issue 12 the ranks ran as
the agent's own user, i.e. root in most deployments (``sh -c 'id'`` printed uid=0).
The policy, applied once when the agent's configuration is built (:func:`job_user_for`):

* ``run_as_user`` set: every rank runs as that user (and its primary group, no
  supplementary groups), with HOME in the attempt directory. The agent makes the
  attempt directory (and the unpacked workdir) and the job's local checkpoint
  directory belong to that user before the ranks start. ``root`` is refused here.
* no ``run_as_user`` and the agent is root: the agent refuses to start (a clear error
  naming both ways out) unless ``allow_root_jobs`` says the operator really wants jobs
  to run as root (a single-user laptop, this repository's tests and demo).
* no ``run_as_user`` and the agent is not root: the ranks run as the agent's user.

Per-job identities (``job_uid_range``, like systemd's DynamicUser): instead of one
``run_as_user`` shared by every job, each **job** gets its own uid (and a group of the
same number) from the configured range the first time one of its attempts runs here,
kept in ``<work_dir>/identities.json`` so a job keeps its uid (and its files) across
attempts and agent restarts. No two jobs' ranks share a uid, so the kernel keeps them
apart, even two jobs of one team: another job's ``/proc/<pid>/environ``, signals, 0700
attempt and checkpoint directories. Why per job and not per team: two members of a
team are two people; with a uid per team, one member's job read the other's tokens
from ``/proc`` and wrote into its checkpoints. What a team's jobs legitimately share
(a checkpoint to start from) goes through the broker's shares and a read-only copy
(region_agents/resume_views.py), not through a common uid. ``job_identity: team``
keeps the older uid-per-team scheme (:class:`IdentityScope`). The uids need no
``/etc/passwd`` entry (uids taken by one are skipped) and are not reused: a job's files
keep their owner.

``/proc`` of other jobs: when ``unshare`` and ``setpriv`` (util-linux) are there and a
probe works, each rank starts in a private mount namespace with its own ``/proc``
mounted ``hidepid=invisible``, then drops to its identity (``setpriv --clear-groups
--no-new-privs``): it sees only its own identity's processes. Otherwise ranks drop with
``Popen(user=...)`` and the operator should mount the host's ``/proc`` with
``hidepid=invisible`` (docs/operator/agent-host.md).

The job user must be able to traverse to the agent's work dir and read the Python it
runs (the venv, the trainer); docs/operator/limits.md, "Job user".
"""

from __future__ import annotations

import contextlib
import enum
import grp
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from checkpoint_layout.nofollow import read_small, replace_file


class JobUserError(ValueError):
    """The configuration would run jobs as root, or names a user that does not exist."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int

    def popen_kwargs(self) -> dict[str, object]:
        """subprocess.Popen arguments that drop to this user (setgid, setgroups, setuid)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def isolated(self, argv: list[str], env: dict[str, str], tools: ProcTools,
                 python: str) -> tuple[list[str], dict[str, str], int]:
        """(argv, env, fd) for a Popen that starts ``argv`` in a private mount namespace
        with its own ``hidepid=invisible`` /proc, dropped to this user (no groups, no new
        privileges): the rank sees and can signal only its own identity's processes.

        Why the fd: ``unshare``, ``bash``, ``mount`` and ``setpriv`` run as root before the
        drop, so they must not see the job's environment (``LD_PRELOAD``, ``BASH_ENV``,
        ``GLIBC_TUNABLES``, exported bash functions, ``PATH`` would each run the job's
        code as root). They get a fixed minimal environment; the job's goes through a
        memfd that a tiny ``python -I -S`` reads *after* the drop before it execs the
        rank. Every exec keeps the pid, so the rank's pid is the Popen's. The caller
        passes ``fd`` (``pass_fds``) and closes it after the Popen."""
        fd = os.memfd_create("cb-rank-env", os.MFD_CLOEXEC)
        data = b"\0".join(f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in env.items())
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        script = (f"{shlex.quote(tools.mount)} -t proc -o hidepid=invisible,nosuid,nodev proc"
                  ' /proc && exec "$0" --reuid="$1" --regid="$2" --clear-groups --no-new-privs'
                  ' -- "${@:3}"')
        full = [tools.unshare, "--mount", "--propagation", "private", "--", tools.bash,
                "--noprofile", "--norc", "-c", script, tools.setpriv, str(self.uid),
                str(self.gid), python, "-I", "-S", "-c", EXEC_WITH_ENV, str(fd), *argv]
        return full, dict(ROOT_ENV), fd


# Run as the job's user (after setpriv): read the job's environment from the fd, exec.
EXEC_WITH_ENV = (
    "import os, sys\n"
    "fd = int(sys.argv[1]); chunks = []\n"
    "while (b := os.read(fd, 1 << 20)): chunks.append(b)\n"
    "os.close(fd)\n"
    "env = dict(x.decode('utf-8', 'surrogateescape').split('=', 1)"
    " for x in b''.join(chunks).split(b'\\0') if b'=' in x)\n"
    "try:\n"
    "    os.execvpe(sys.argv[2], sys.argv[2:], env)\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'cannot start {sys.argv[2]!r}: {e.strerror}\\n'); sys.exit(127)\n"
)
ROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


@dataclass(frozen=True)
class ProcTools:
    """Where unshare, setpriv and bash are (absolute: found once, as root)."""

    unshare: str
    setpriv: str
    bash: str
    mount: str


def proc_tools(python: str = "") -> ProcTools | None:
    """The tools for a private hidepid /proc per rank, if they are here and a probe works
    (root, util-linux, a kernel with per-mount procfs options), else None."""
    if os.geteuid() != 0:
        return None
    found = [shutil.which(t, path=ROOT_ENV["PATH"]) for t in ("unshare", "setpriv", "bash", "mount")]
    if not all(found):
        return None
    tools = ProcTools(*found)  # type: ignore[arg-type]
    argv, env, fd = JobUser("probe", 65534, 65534).isolated(
        ["/bin/sh", "-c", 'test ! -e /proc/1/environ && test "$CB_PROBE" = 1'], {
            "CB_PROBE": "1", "PATH": ROOT_ENV["PATH"]}, tools, python or sys.executable)
    try:
        ok = subprocess.run(argv, env=env, pass_fds=(fd,), capture_output=True,
                            timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    finally:
        os.close(fd)
    return tools if ok else None


UID_RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_uid_range(text: str) -> tuple[int, int]:
    """``"61000-61999"`` -> (61000, 61999); JobUserError if malformed or unsafe."""
    m = UID_RANGE.match(text.strip())
    if not m:
        raise JobUserError(f"job_uid_range {text!r} is not FIRST-LAST (e.g. 61000-61999)")
    first, last = int(m.group(1)), int(m.group(2))
    if first < 1000 or last < first or last >= 2**31 - 1 or last == 65534:
        raise JobUserError(f"job_uid_range {text!r}: give 1000 <= FIRST <= LAST < 2^31,"
                           " a range no system or login user has")
    return first, last


class IdentityScope(enum.Enum):
    """Who gets a uid of their own from ``job_uid_range`` (see the module doc)."""

    JOB = "job"  # each job: two jobs of one team cannot touch each other (the default)
    TEAM = "team"  # each team: a team's jobs share a uid (the older scheme)


def identity_key(scope: IdentityScope, job_id: str, team: str) -> str:
    """The identities.json key a job's identity is kept under. Team keys are the bare
    team name (the older file format); job keys are ``job:<id>`` (a team name has no ':')."""
    if scope is IdentityScope.JOB:
        return f"job:{job_id}"
    return team or "(no team)"


class IdentityPool:
    """One Unix identity per job (or per team), allocated from a uid range (see the
    module doc)."""

    def __init__(self, first: int, last: int, state_path: str | os.PathLike[str],
                 scope: IdentityScope = IdentityScope.JOB) -> None:
        self.first, self.last = first, last
        self.state_path = Path(state_path)
        self.scope = scope
        self._lock = threading.Lock()

    def _load(self) -> dict[str, int]:
        got = read_small(self.state_path)
        if got is None:
            return {}
        with contextlib.suppress(ValueError):
            data = json.loads(got[0])
            if isinstance(data, dict):
                return {str(k): int(v) for k, v in data.items()}
        raise JobUserError(f"{self.state_path} is not a JSON object of team -> uid: fix or"
                           " remove it (teams would lose their files' ownership)")

    @staticmethod
    def _taken(uid: int) -> bool:
        for lookup in (pwd.getpwuid, grp.getgrgid):
            try:
                lookup(uid)
                return True
            except KeyError:
                pass
        return False

    def for_job(self, job_id: str, team: str) -> JobUser:
        """The identity ``job_id`` (of ``team``) runs as: its own, or its team's under
        :attr:`IdentityScope.TEAM`. Allocated on first use; JobUserError when the range
        is used up."""
        return self._allocate(identity_key(self.scope, job_id, team))

    def for_team(self, team: str) -> JobUser:
        """The team's identity (:attr:`IdentityScope.TEAM`), allocated on first use."""
        return self._allocate(identity_key(IdentityScope.TEAM, "", team))

    def _allocate(self, key: str) -> JobUser:
        with self._lock:
            table = self._load()
            uid = table.get(key)
            if uid is None:
                used = set(table.values())
                uid = next((u for u in range(self.first, self.last + 1)
                            if u not in used and not self._taken(u)), None)
                if uid is None:
                    raise JobUserError(f"job_uid_range {self.first}-{self.last} is used up"
                                       f" ({len(table)} identities): widen it")
                table[key] = uid
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                replace_file(self.state_path, json.dumps(table, sort_keys=True), mode=0o600)
            return JobUser(f"cbjob{uid}", uid, uid)


def check_can_run(user: JobUser, python: str, work_dir: str) -> None:
    """Refuse to start an agent whose job user could not run a single rank: it cannot
    execute the interpreter (e.g. a venv whose base Python lives under /root) or reach
    the work dir. Found the hard way: every launch then failed at once and the job
    bounced between relaunches. Raises JobUserError naming what to fix."""
    import subprocess

    probe = f"import os, sys; sys.exit(0 if os.access({work_dir!r}, os.X_OK) else 3)"
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, timeout=60,
                             **user.popen_kwargs())  # type: ignore[call-overload]
    except OSError as e:
        raise JobUserError(f"run_as_user {user.name!r} cannot execute {python}"
                           f" ({e.strerror or e}): install the Python it runs jobs with where"
                           " that user can read it (not under /root)") from None
    if res.returncode == 3:
        raise JobUserError(f"run_as_user {user.name!r} cannot reach the work dir {work_dir}:"
                           " make its parent directories traversable (chmod o+x)")
    if res.returncode != 0:
        raise JobUserError(f"run_as_user {user.name!r} cannot run {python}:"
                           f" {res.stderr.decode(errors='replace').strip()[-300:]}")


def job_user_for(run_as_user: str, allow_root_jobs: bool, euid: int | None = None) -> JobUser | None:
    """The user ranks run as; None = the agent's own user. Raises JobUserError."""
    euid = os.geteuid() if euid is None else euid
    if run_as_user:
        try:
            pw = pwd.getpwnam(run_as_user)
        except KeyError:
            raise JobUserError(f"run_as_user {run_as_user!r} does not exist on this host;"
                               f" create it (useradd --system {run_as_user})") from None
        if pw.pw_uid == 0 and not allow_root_jobs:
            raise JobUserError(f"run_as_user {run_as_user!r} is root; name an unprivileged user")
        if euid != 0 and pw.pw_uid != euid:
            raise JobUserError(f"run_as_user {run_as_user!r}: only a root agent can run jobs as"
                               " another user; run the agent as root or drop run_as_user")
        return JobUser(pw.pw_name, pw.pw_uid, pw.pw_gid)
    if euid == 0 and not allow_root_jobs:
        raise JobUserError(
            "the agent runs as root and no run_as_user is configured: jobs would run as root."
            " Set --run-as-user USER (e.g. cbjob, created with `useradd --system cbjob`), or"
            " --allow-root-jobs if every job on this host may really run as root")
    return None
