"""FIXTURE, NOT A REAL API SERVER: a tiny http.server on 127.0.0.1 that answers the
few Kubernetes API endpoints the KubernetesExecutor calls (list nodes, create/list/
delete jobs, create/delete services, list/get/delete pods), keeping objects as plain
JSON dicts. A graceful pod delete stamps ``deletionTimestamp`` as the API server does;
the pod goes once a test terminated it and calls :meth:`reap` (the kubelet's part).

Why: no cluster (kind/minikube) is available here. The executor still goes through
the real ``kubernetes`` client (real HTTP, real (de)serialization of its models);
only the server side is this stand-in, and pods change state only when a test says so.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


def _match(labels: dict, selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


class FakeKubeAPI:
    def __init__(self, nodes: list[dict]) -> None:
        self.nodes = nodes
        self.jobs: dict[str, dict] = {}
        self.services: dict[str, dict] = {}
        self.pods: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, dict]] = []  # (path, body) of DELETE calls
        self.pod_gets: list[tuple[str, str, str]] = []  # (namespace, pod, Authorization)
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                api._handle(self, "GET", None)

            def do_POST(self):  # noqa: N802
                api._handle(self, "POST", self._body())

            def do_DELETE(self):  # noqa: N802
                api._handle(self, "DELETE", self._body())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeKubeAPI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- routing -------------------------------------------------------------------
    def _handle(self, h, method: str, body: dict | None) -> None:
        url = urlparse(h.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        with self._lock:
            self.requests.append((method, path))
            if method == "DELETE":
                self.deleted.append((path, body or {}))
            if method == "GET" and path == "/api/v1/nodes":
                return h._send(200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {},
                                     "items": self.nodes})
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", path)
            if m and method in ("GET", "DELETE"):
                sel = q.get("labelSelector", "")
                items = [p for p in self.pods.values() if _match(p["metadata"].get("labels", {}), sel)]
                if method == "DELETE":  # graceful: stamped, removed once terminated (reap)
                    grace = int((body or {}).get("gracePeriodSeconds", 30))
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + grace))
                    for p in items:
                        p["metadata"].setdefault("deletionTimestamp", stamp)
                        p["metadata"].setdefault("deletionGracePeriodSeconds", grace)
                return h._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path)
            if m and method == "GET":
                self.pod_gets.append((m.group(1), m.group(2), h.headers.get("Authorization", "")))
                pod = self.pods.get(m.group(2))
                return h._send(200, pod) if pod else h._send(404, {
                    "kind": "Status", "status": "Failure", "code": 404, "reason": "NotFound"})
            m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/services(?:/([^/]+))?", path)
            if m:
                return self._crud(h, method, body, self.services, m.group(2), "Service")
            m = re.fullmatch(r"/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?", path)
            if m:
                if method == "GET" and not m.group(2):
                    sel = q.get("labelSelector", "")
                    items = [j for j in self.jobs.values() if _match(j["metadata"].get("labels", {}), sel)]
                    return h._send(200, {"kind": "JobList", "apiVersion": "batch/v1", "metadata": {},
                                         "items": items})
                # Side effects first: the client may look as soon as it has the response.
                if method == "POST" and body["metadata"]["name"] not in self.jobs:
                    self._make_pods(body)
                elif method == "DELETE" and (body or {}).get("propagationPolicy") != "Orphan":
                    for name in [n for n, p in self.pods.items()
                                 if p["metadata"]["labels"].get("job-name") == m.group(2)]:
                        del self.pods[name]
                return self._crud(h, method, body, self.jobs, m.group(2), "Job")
            return h._send(404, {"kind": "Status", "status": "Failure", "code": 404,
                                 "reason": "NotFound", "message": f"fixture: no route {path}"})

    def _crud(self, h, method, body, store, name, kind):
        if method == "POST":
            name = body["metadata"]["name"]
            if name in store:
                return h._send(409, {"kind": "Status", "status": "Failure", "code": 409,
                                     "reason": "AlreadyExists", "message": f"{kind} {name} exists"})
            store[name] = body
            return h._send(201, body)
        if method == "DELETE":
            if name not in store:
                return h._send(404, {"kind": "Status", "status": "Failure", "code": 404,
                                     "reason": "NotFound", "message": f"{kind} {name} not found"})
            obj = store.pop(name)
            if kind == "Job":
                return h._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            return h._send(200, obj)
        return h._send(200, store[name]) if name in store else h._send(404, {"kind": "Status"})

    def _make_pods(self, job: dict) -> None:
        name = job["metadata"]["name"]
        tmpl = job["spec"]["template"]
        hosts = []
        for term in (tmpl["spec"].get("affinity", {}).get("nodeAffinity", {})
                     .get("requiredDuringSchedulingIgnoredDuringExecution", {})
                     .get("nodeSelectorTerms", [])):
            for e in term.get("matchExpressions", []):
                if e["key"] == "kubernetes.io/hostname":
                    hosts = e["values"]
        for i in range(job["spec"]["completions"]):
            pod = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{name}-{i}-abcde",
                             "labels": {**tmpl["metadata"]["labels"], "job-name": name},
                             "annotations": {"batch.kubernetes.io/job-completion-index": str(i)}},
                "spec": {**tmpl["spec"], "nodeName": hosts[i] if i < len(hosts) else ""},
                "status": {"phase": "Pending"},
            }
            self.pods[pod["metadata"]["name"]] = pod

    # ---- test controls -----------------------------------------------------------------
    def _status(self, phase: str, state: dict) -> dict:
        return {"phase": phase, "containerStatuses": [
            {"name": "trainer", "image": "img", "imageID": "", "ready": phase == "Running",
             "restartCount": 0, "state": state}]}

    def set_running(self, job_name: str) -> None:
        with self._lock:
            for p in self.pods.values():
                if p["metadata"]["labels"]["job-name"] == job_name:
                    p["status"] = self._status("Running", {"running": {}})

    def terminate(self, job_name: str, index: int, exit_code: int, message: str = "") -> None:
        with self._lock:
            pod = self.pods[f"{job_name}-{index}-abcde"]
            phase = "Succeeded" if exit_code == 0 else "Failed"
            pod["status"] = self._status(phase, {"terminated": {
                "exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "message": message}})

    def reap(self) -> None:
        """The kubelet's last step: pods being deleted whose containers ended go away."""
        with self._lock:
            for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")
                         and p["status"].get("phase") in ("Succeeded", "Failed")]:
                del self.pods[name]
