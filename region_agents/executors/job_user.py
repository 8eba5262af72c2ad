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

The job user must be able to traverse to the agent's work dir and read the Python it
runs (the venv, the trainer); docs/operator/limits.md, "Job user".
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class JobUserError(ValueError):
    """The configuration would run jobs as root, or names a user that does not exist."""


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int

    def own(self, paths: Iterable[Path]) -> None:
        """Give ``paths`` (recursively) to this user, so its ranks can write there."""
        for top in paths:
            if not top.exists():
                continue
            os.chown(top, self.uid, self.gid)
            if top.is_dir():
                for root, dirs, files in os.walk(top):
                    for name in dirs + files:
                        os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)

    def popen_kwargs(self) -> dict[str, object]:
        """subprocess.Popen arguments that drop to this user (setgid, setgroups, setuid)."""
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


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
