"""A list-then-watch cache of Kubernetes objects (an informer, reduced to what the
agent needs): one thread per watched kind, one long-lived request each.

Why watches and not polling: a 1 s ``list`` of an attempt's pods costs a request per
attempt per second and still misses what happens between two lists (a pod exiting 75
and being deleted within the second). A watch delivers every change once, in order, on
one connection per kind for the whole namespace, and the cache answers the agent's
``poll()`` without any request. On a broken or expired watch (410 Gone) it lists again
and replaces the cache, the way client-go's reflector does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 60  # server-side timeout of one watch request (then resumed)


class _RawWatch(watch.Watch):
    """Events as the API server's JSON (dicts). The cache keeps dicts, so turning every
    event into the client's model objects (and back) would be CPU spent for nothing; at
    thousands of pods it would be most of the agent's."""

    def get_return_type(self, func: Callable[..., Any]) -> None:  # type: ignore[override]
        return None


class ObjectCache:
    """Objects of one kind (as plain dicts, keyed by name), kept current by a watch.

    ``list_fn`` is a ``kubernetes`` client list method (``list_namespaced_pod``, with
    ``namespace``/``label_selector`` in ``kwargs``, or ``list_node``). ``on_change`` is
    called (from the watch thread) after each applied change.
    """

    def __init__(self, list_fn: Callable[..., Any], *, what: str,
                 on_change: Callable[[], None] | None = None, **kwargs: Any) -> None:
        self.list_fn = list_fn
        self.kwargs = kwargs
        self.what = what
        self.on_change = on_change
        self._objects: dict[str, dict] = {}
        # names changed since the last take_changed(); None: a relist replaced everything
        self._changed: set[str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch: watch.Watch | None = None
        self.lists = 0  # full lists made (start-up and after a broken watch)
        self.watches = 0  # watch requests made

    def start(self, wait_s: float = 30.0) -> ObjectCache:
        self._thread = threading.Thread(target=self._run, name=f"k8s-watch-{self.what}",
                                        daemon=True)
        self._thread.start()
        if not self.synced.wait(wait_s):
            raise RuntimeError(f"could not list {self.what} within {wait_s:g} s")
        return self

    def stop(self) -> None:
        self._stop.set()
        w = self._watch
        if w is not None:
            w.stop()

    def snapshot(self) -> dict[str, dict]:
        with self._lock:
            return dict(self._objects)

    def get(self, name: str) -> dict | None:
        with self._lock:
            return self._objects.get(name)

    def take_changed(self) -> set[str] | None:
        """Names added, modified or deleted since the previous call; ``None`` when a
        (re)list replaced the cache, or on the first call: everything may differ.

        Why: a consumer that derives something per object (the agent's node health, every
        tick) then redoes only what changed. At 2,000 nodes a full re-derivation five
        times a second was a steady share of the agent's CPU. One consumer per cache."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return changed

    def _relist(self) -> str:
        resp = self.list_fn(_preload_content=False, **self.kwargs)  # JSON, not models
        lst = json.loads(resp.data)
        self.lists += 1
        objs = {o["metadata"]["name"]: o for o in lst.get("items") or []}
        with self._lock:
            self._objects = objs
            self._changed = None
        self.synced.set()
        if self.on_change:
            self.on_change()
        return lst["metadata"]["resourceVersion"]

    def _run(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    rv = self._relist()
                self._watch = w = _RawWatch()
                self.watches += 1
                for ev in w.stream(self.list_fn, resource_version=rv,
                                   allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S,
                                   _request_timeout=WATCH_TIMEOUT_S + 30, **self.kwargs):
                    if self._stop.is_set():
                        break
                    kind = ev["type"]
                    if kind == "ERROR":
                        raw = ev.get("raw_object") or {}
                        if raw.get("code") == 410:  # too old: list again
                            rv = ""
                        break
                    obj = ev["raw_object"]
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if kind == "BOOKMARK":
                        continue
                    name = obj["metadata"]["name"]
                    with self._lock:
                        if kind == "DELETED":
                            self._objects.pop(name, None)
                        else:
                            self._objects[name] = obj
                        if self._changed is not None:
                            self._changed.add(name)
                    if self.on_change:
                        self.on_change()
            except Exception as e:  # noqa: BLE001 - a watch breaks: resume (or relist)
                if self._stop.is_set():
                    return
                status = getattr(e, "status", None)
                if status == 410 or "410" in str(e) or "too old" in str(e):
                    rv = ""
                log.warning("watch of %s broke (%s): resuming", self.what, e)
                time.sleep(0.5)
