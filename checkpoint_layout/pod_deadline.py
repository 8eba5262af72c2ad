"""A Kubernetes pod's stop deadline for its trainer: the container's preStop hook.

Why: on a local agent the Stop's deadline reaches the ranks as a file the agent writes
right before its SIGTERM (``CB_STOP_DEADLINE_FILE``, :mod:`checkpoint_layout.stop_deadline`).
In Kubernetes the agent cannot write into the pod, the environment is fixed at launch,
and the downward API cannot show a deletion (its annotation refresh also lags by up to
a minute). What the cluster does know: the agent deletes each pod with the Stop's grace
(``DeleteOptions.gracePeriodSeconds``), and the API server stamps the pod with
``metadata.deletionTimestamp`` = the delete + that grace, the moment after which the
kubelet SIGKILLs. The kubelet runs the container's ``preStop`` hook *before* its
SIGTERM, so this hook (``python -m checkpoint_layout.pod_deadline``) reads its own pod
through the in-cluster API (the pod's service account needs ``get`` on pods) and writes
that deadline to ``CB_STOP_DEADLINE_FILE``: every rank of the pod then reads it on
SIGTERM exactly as it does under the local agent. One request per pod, not per rank.

Never fails the termination: any error is printed and the hook exits 0, and the
trainer falls back to ``CB_GRACE_S`` (the pod's terminationGracePeriodSeconds).
Standard library only: it runs in the trainer's image, which may not carry the
``kubernetes`` client.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import sys
import urllib.request
from datetime import datetime
from pathlib import Path

from checkpoint_layout.stop_deadline import STOP_DEADLINE_ENV, StopDeadline, write_stop_deadline

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_ENV = "CB_POD_NAME"  # downward API: metadata.name
POD_NAMESPACE_ENV = "CB_POD_NAMESPACE"  # downward API: metadata.namespace


def deadline_of(pod: dict) -> StopDeadline | None:
    """The stop deadline a pod object carries (None: the pod is not being deleted)."""
    meta = pod.get("metadata") or {}
    stamp = meta.get("deletionTimestamp")
    if not stamp:
        return None
    try:
        deadline = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        grace = float(meta.get("deletionGracePeriodSeconds") or 0.0)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(deadline) and deadline > 0 and math.isfinite(grace) and grace >= 0):
        return None
    return StopDeadline(deadline, grace)


def fetch_pod(api: str, namespace: str, name: str, *, token: str, ca_file: str | None,
              timeout_s: float = 3.0) -> dict:
    """GET /api/v1/namespaces/<ns>/pods/<name> with the service account's token."""
    req = urllib.request.Request(f"{api.rstrip('/')}/api/v1/namespaces/{namespace}/pods/{name}",
                                 headers={"Authorization": f"Bearer {token}",
                                          "Accept": "application/json"})
    ctx = ssl.create_default_context(cafile=ca_file) if api.startswith("https") else None
    with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as resp:  # noqa: S310
        return json.loads(resp.read())


def in_cluster_api() -> str:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise RuntimeError("not in a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset)")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def publish(api: str, *, namespace: str, name: str, token: str, ca_file: str | None,
            out: str, tries: int = 2) -> StopDeadline | None:
    """Read the pod's deadline and write it to ``out``; None when the pod shows none."""
    last: Exception | None = None
    for _ in range(max(1, tries)):
        try:
            sd = deadline_of(fetch_pod(api, namespace, name, token=token, ca_file=ca_file))
        except (OSError, ValueError) as e:  # URLError/HTTPError are OSErrors
            last = e
            continue
        if sd is not None:
            write_stop_deadline(out, sd)
        return sd
    raise RuntimeError(f"could not read pod {namespace}/{name}: {last}")


def main(argv: list[str] | None = None) -> int:
    out = os.environ.get(STOP_DEADLINE_ENV, "")
    name = os.environ.get(POD_NAME_ENV, "")
    try:
        if not out or not name:
            raise RuntimeError(f"{STOP_DEADLINE_ENV} and {POD_NAME_ENV} must be set")
        namespace = os.environ.get(POD_NAMESPACE_ENV, "") or (SA_DIR / "namespace").read_text().strip()
        token = (SA_DIR / "token").read_text().strip()
        ca = SA_DIR / "ca.crt"
        sd = publish(in_cluster_api(), namespace=namespace, name=name, token=token,
                     ca_file=str(ca) if ca.exists() else None, out=out)
    except Exception as e:  # noqa: BLE001 - a preStop hook must never stand in the way
        print(f"pod_deadline: no stop deadline for the trainer ({e}); CB_GRACE_S applies",
              file=sys.stderr)
        return 0
    if sd is None:
        print("pod_deadline: the pod is not being deleted; nothing written", file=sys.stderr)
    else:
        print(f"pod_deadline: stop deadline {sd.deadline:.0f} (grace {sd.grace_s:.0f}s) -> {out}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
