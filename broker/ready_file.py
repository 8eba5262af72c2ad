"""``brokerctl serve --ready-file PATH``: a file that exists only while the broker serves.

Why a file: a script (or a README block) that starts ``brokerctl serve &`` must not race
it. ``brokerctl wait-ready`` polls the API (it needs the address and a credential); a
file needs neither: ``while [ ! -e PATH ]; do sleep 0.2; done``. Both mean the same
thing: the file is written after :meth:`BrokerServer.start` returned, i.e. the TLS
listener is bound and serving, the store is open, the leader lease was tried and (with
API workers) every worker serves, so a call made after it appears is answered.

The file is written atomically (a temporary file renamed over it: a reader never sees
half of it), any stale one from an earlier run is removed before the broker starts,
and it is removed when the broker stops. Its content is JSON a script may read: the
bound ports (``--listen host:0`` picks a free one), the pid and this replica's role.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def clear(path: str) -> None:
    """Remove a stale ready file (an earlier run's) before the broker starts."""
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def write(path: str, info: dict[str, Any]) -> None:
    """Write ``info`` as JSON to ``path`` atomically (rename over it). Raises OSError
    when the directory is not writable: the caller reports it as a start failure."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=str(target.parent or "."))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(info, f, sort_keys=True)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def info_of(server: Any) -> dict[str, Any]:
    """What the file says about a started :class:`broker.server.BrokerServer`."""
    cfg = server.config
    host = cfg.listen.rsplit(":", 1)[0] if ":" in cfg.listen else cfg.listen
    leading = server.leadership is not None and server.leadership.is_leader
    return {"address": f"{host}:{server.port}", "port": server.port,
            "agent_port": server.agent_port, "metrics_port": server.metrics_port,
            "pid": os.getpid(),
            "role": getattr(server, "role", None) or ("leader" if leading else "standby"),
            "tls": not cfg.insecure_dev}
