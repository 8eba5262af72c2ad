"""The node-unhealthy kill path does not hold the executor up while the API server is slow.

When a node turns unhealthy the agent calls ``executor.fail`` for each attempt on it,
which kills the attempt's pods (a DELETE per pod, by name). Those requests used to
run with the executor's lock held, so one slow API server answer stalled ``poll()``,
``running()`` and Launches for as long as it took. Here a real validating admission
webhook (an HTTPS server of the test's, called by the real API server) holds every
DELETE of a pod in the test's namespace until the test lets it go: while the kill's
first request is held, ``fail()`` has returned, and ``poll()``, ``running()`` and a
Launch of another job (its Service, Secret and pod created) all complete; once the
webhook answers, the failed attempt ends FAILED blaming the node.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.helpers import (
    AS,
    end_everything,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    terminal,
    trainer_attempt,
    wait,
)

NODES = ["kl-n1", "kl-n2"]
SLEEP = ("python", "-c", "import time; time.sleep(600)")
HOLD_MAX_S = 25.0  # the webhook answers by then at the latest (its timeout is 30 s)


class SlowDeletes:
    """A validating webhook that records the pod DELETEs it sees and, while ``hold`` is
    on, answers each only when ``release`` is set."""

    def __init__(self, cp: ControlPlane) -> None:
        self.seen: list[str] = []
        self.hold = False
        self.holding = threading.Event()  # a DELETE is being held now
        self.release = threading.Event()
        cert = cp.pki.issue(f"slow-webhook-{uuid.uuid4().hex[:6]}", "slow-webhook", server=True,
                            sans=("127.0.0.1",))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                req = review["request"]
                outer.seen.append(req.get("name", ""))
                if outer.hold:
                    outer.holding.set()
                    outer.release.wait(HOLD_MAX_S)
                    outer.holding.clear()
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": req["uid"], "allowed": True}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/validate"

    def configuration(self, name: str, namespace: str, ca: bytes) -> dict:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [{
                "name": "slow-pod-delete.computebroker.test",
                "clientConfig": {"url": self.url, "caBundle": base64.b64encode(ca).decode()},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"],
                           "operations": ["DELETE"], "resources": ["pods"],
                           "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 30,
            }],
        }

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def _webhook_active(cp: ControlPlane, ns: str, hook: SlowDeletes) -> None:
    """Until the API server calls the webhook (it picks configurations up shortly after
    they are created): create and delete a pod no node takes until the webhook sees it."""
    core = cp.core()
    probe = {"metadata": {"name": "probe"}, "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "x", "securityContext": {
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}],
        "nodeSelector": {"computebroker.io/no-such-node": "x"}}}
    deadline = time.monotonic() + 60
    while "probe" not in hook.seen:
        assert time.monotonic() < deadline, "the webhook was never called"
        core.create_namespaced_pod(ns, probe)
        core.delete_namespaced_pod("probe", ns, grace_period_seconds=0)
        wait(lambda: not [p for p in core.list_namespaced_pod(ns).items
                          if p.metadata.name == "probe"], timeout=30, what="probe gone")
        time.sleep(0.5)


def test_node_unhealthy_kill_does_not_block_other_operations(cluster_a: ControlPlane,
                                                             kubelet: ProcessKubelet) -> None:
    ex, ns = executor_for(cluster_a)
    hook = SlowDeletes(cluster_a)
    admission = client.AdmissionregistrationV1Api(cluster_a.api_client())
    name = f"cb-slow-delete-{ns}"
    admission.create_validating_webhook_configuration(
        hook.configuration(name, ns, cluster_a.pki.ca.read_bytes()))
    try:
        _webhook_active(cluster_a, ns, hook)
        with shared_dir() as ckpt:
            ex.launch(trainer_attempt("victim", NODES[:1], ckpt, command=SLEEP))
            events = poll_until(ex, lambda evs: any(
                e.job_id == "victim" and e.state == AS.ATTEMPT_STATE_RUNNING for e in evs),
                what="victim running")

            hook.hold = True
            t0 = time.monotonic()
            ex.fail("victim", 1, "node kl-n1 unhealthy: NotReady", ["kl-n1"])  # the agent's call
            fail_s = time.monotonic() - t0
            assert hook.holding.wait(20), "the kill's pod DELETE never reached the API server"
            # the kill's first request is held by the API server's webhook call, now:
            t1 = time.monotonic()
            events.extend(ex.poll())
            assert [r.job_id for r in ex.running()] == ["victim"]
            ex.launch(trainer_attempt("other", NODES[1:], ckpt, command=SLEEP))
            ex.wait_created("other", 1, timeout=20)
            others_s = time.monotonic() - t1
            assert hook.holding.is_set(), "the webhook let the DELETE go before the checks ended"
            assert fail_s < 2.0, f"fail() waited {fail_s:.1f} s for the API server"
            assert others_s < 15.0, f"poll/running/launch took {others_s:.1f} s meanwhile"
            assert cluster_a.core().read_namespaced_pod(
                "cb-other-a1-0", ns).metadata.name == "cb-other-a1-0"

            hook.hold = False
            hook.release.set()
            poll_until(ex, terminal("victim"), what="victim to end", events=events)
            end = state_of(events, "victim")
            assert end.state == AS.ATTEMPT_STATE_FAILED and end.failed_nodes == ["kl-n1"]
            assert "unhealthy" in end.message
            assert "cb-victim-a1-0" in hook.seen  # the kill's DELETE was the one held
            ex.stop("other", 1, False, 0)
            poll_until(ex, terminal("other"), what="other stopped", events=events)
    finally:
        hook.release.set()
        admission.delete_validating_webhook_configuration(name)
        hook.stop()
        ex.shutdown()
        end_everything(cluster_a, ns, kubelet)
