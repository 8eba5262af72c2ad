"""Users' code (a workdir) on the Kubernetes executor, against the REAL API server: the
executor puts the agent's verified tarball into the attempt's checkpoint location, and
the pod's supervisor fetches it there, checks its size and sha256 and unpacks it with the
project's extractor before the command starts in it. Pods run in a namespace enforcing
the *restricted* Pod Security Standard, under the process-backed node fixture (the one
simulated part, tests/fixtures/k8s/kubelet.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokersdk.workdir import pack
from checkpoint_layout import workdir_store
from region_agents.executors.base import EXIT_WORKDIR_REFUSED, AttemptSpec
from region_agents.executors.k8s_manifests import SHARED_DIR, resource_name
from region_agents.executors.kubernetes import KubernetesExecutor
from tests.fixtures.k8s.controlplane import ControlPlane
from tests.fixtures.k8s.kubelet import ProcessKubelet
from tests.k8s.helpers import (
    AS,
    executor_for,
    poll_until,
    process_nodes,
    shared_dir,
    state_of,
    steps_saved,
    terminal,
    trainer_attempt,
    wait,
)

NODES = ["wd-n1", "wd-n2"]
RUN = """\
import json, os, sys
out = {"cwd": os.getcwd(), "data": open("data/words.txt").read().strip(),
       "helper": __import__("helper").VALUE, "uid": os.getuid()}
with open(os.environ["MARKER"] + os.environ.get("MARKER_SUFFIX", ""), "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def kubelet(cluster_a: ControlPlane) -> Iterator[ProcessKubelet]:
    with process_nodes(cluster_a, NODES) as k:
        yield k


def code_tar(tmp: Path) -> tuple[Path, str]:
    """The user's directory, packed by the SDK exactly as `brokerctl submit --workdir`."""
    src = tmp / "code"
    (src / "data").mkdir(parents=True)
    (src / "run.py").write_text(RUN)
    (src / "helper.py").write_text("VALUE = 42\n")
    (src / "data" / "words.txt").write_text("shipped with the job\n")
    p = pack(src)
    tar = tmp / "code.tar"
    p.write_to(tar)
    return tar, p.digest


def raw_tar(tmp: Path, raw: bytes) -> tuple[Path, str]:
    tar = tmp / "raw.tar"
    tar.write_bytes(raw)
    return tar, "sha256:" + hashlib.sha256(raw).hexdigest()


def with_workdir(spec: AttemptSpec, tar: Path, digest: str) -> AttemptSpec:
    """What the agent does: the Launch names the digest, staging hands over the tar."""
    spec.spec.workdir.digest = digest
    spec.spec.workdir.size_bytes = tar.stat().st_size
    spec.workdir_tar, spec.workdir_size = str(tar), tar.stat().st_size
    return spec


def stage_and_launch(ex: KubernetesExecutor, spec: AttemptSpec) -> None:
    ex.prepare(spec)
    ex.stage_workdir(spec, spec.workdir_tar)  # the agent's staging thread
    ex.launch(spec)


def test_a_workdir_job_runs_its_shipped_code_in_its_pod(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            tar, digest = code_tar(root)
            ckpt, marker = root / "ckpt", root / "marker.json"
            spec = with_workdir(trainer_attempt("wd-ok", NODES[:1], ckpt, command=("python", "run.py"),
                                                env={"MARKER": str(marker)}), tar, digest)
            stage_and_launch(ex, spec)
            # the tarball sits in the attempt's own checkpoint location, named by digest
            stored = ckpt / "workdir" / f"sha256-{digest[7:]}.tar"
            assert stored.read_bytes() == tar.read_bytes()
            name = resource_name("wd-ok", 1)
            # launch() hands the API requests to a creator thread, which makes the pod
            ex.wait_created("wd-ok", 1)
            pod = wait(lambda: next(iter(cluster_a.core().list_namespaced_pod(ns).items), None),
                       what="the pod")
            env = {e.name: e.value for e in pod.spec.containers[0].env if e.value}
            assert env[workdir_store.URI_ENV] == str(stored)
            assert env[workdir_store.DIGEST_ENV] == digest
            assert env[workdir_store.SIZE_ENV] == str(tar.stat().st_size)
            # still the restricted standard (the API server enforced it at creation)
            assert pod.spec.security_context.run_as_non_root is True
            assert pod.spec.containers[0].security_context.allow_privilege_escalation is False
            events = poll_until(ex, terminal("wd-ok"), what="the workdir job to finish")
            end = state_of(events, "wd-ok")
            logs = kubelet.logs(ns, pod.metadata.name)
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, (end.message, logs)
            out = json.loads(marker.read_text())
            # <CB_WORK_DIR>/workdir, as locally (/var/run is a link to /run on this host)
            assert out["cwd"] in {f"{SHARED_DIR}/workdir", os.path.realpath(f"{SHARED_DIR}/workdir")}
            assert out["data"] == "shipped with the job"
            assert out["helper"] == 42  # the workdir's own module imports
            assert out["uid"] != 0
            assert name in pod.metadata.name
    finally:
        ex.shutdown()


def test_each_pod_of_a_gang_gets_its_own_copy(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            tar, digest = code_tar(root)
            marker = root / "marker"
            script = ("import os, runpy; os.environ['MARKER_SUFFIX'] = '-' + os.environ['NODE_RANK'];"
                      " open('data/words.txt', 'a').write('changed by this pod');"  # own copy
                      " runpy.run_path('run.py')")
            spec = with_workdir(trainer_attempt("wd-gang", NODES, root / "ckpt",
                                                command=("python", "-c", script),
                                                env={"MARKER": str(marker)}), tar, digest)
            ex.discover_nodes()
            stage_and_launch(ex, spec)
            events = poll_until(ex, terminal("wd-gang"), what="the gang to finish")
            end = state_of(events, "wd-gang")
            logs = [p.read_text(errors="replace") for p in kubelet.root.glob(f"pods/{ns}_*/*.log")]
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, (end.message, logs)
            for rank in ("0", "1"):
                out = json.loads(Path(f"{marker}-{rank}").read_text())
                assert out["data"] == "shipped with the job\nchanged by this pod", out
    finally:
        ex.shutdown()


def test_the_built_in_trainer_still_imports_from_the_image_beside_a_workdir(cluster_a, kubelet) -> None:
    """No command: `python -m trainer` in the workdir. The image's own modules stay
    importable after the user's (the supervisor appends its working directory)."""
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            tar, digest = code_tar(root)
            ckpt = root / "ckpt"
            spec = with_workdir(trainer_attempt("wd-trainer", NODES[:1], ckpt, steps=4, every=2),
                                tar, digest)
            stage_and_launch(ex, spec)
            events = poll_until(ex, terminal("wd-trainer"), what="the trainer job to finish")
            end = state_of(events, "wd-trainer")
            logs = [p.read_text(errors="replace")
                    for p in kubelet.root.glob(f"pods/{ns}_*/*.log")]
            assert end.state == AS.ATTEMPT_STATE_SUCCEEDED, (end.message, logs)
            assert steps_saved(ckpt)[-1] == 4
    finally:
        ex.shutdown()


def test_a_tampered_workdir_fails_the_attempt_with_a_clear_message(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            tar, digest = code_tar(root)
            ckpt, marker = root / "ckpt", root / "marker.json"
            spec = with_workdir(trainer_attempt("wd-bad", NODES[:1], ckpt, command=("python", "run.py"),
                                                env={"MARKER": str(marker)}), tar, digest)
            ex.prepare(spec)
            ex.stage_workdir(spec, str(tar))
            # someone with write access to the store swaps the code (same size)
            stored = ckpt / "workdir" / f"sha256-{digest[7:]}.tar"
            swapped = bytearray(stored.read_bytes())
            swapped[swapped.index(b"VALUE = 42")] = ord("X")
            stored.write_bytes(bytes(swapped))
            ex.launch(spec)
            events = poll_until(ex, terminal("wd-bad"), what="the tampered job to fail")
            end = state_of(events, "wd-bad")
            assert end.state == AS.ATTEMPT_STATE_FAILED, end
            assert end.exit_code == EXIT_WORKDIR_REFUSED
            assert "workdir refused" in end.message and f"not {digest}" in end.message, end.message
            assert "tampered" in end.message
            assert end.failed_nodes == []  # not the node's fault
            assert not marker.exists()  # nothing of the user's ran
    finally:
        ex.shutdown()


def test_a_path_traversal_tarball_is_refused_in_the_pod(cluster_a, kubelet) -> None:
    ex, ns = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as t:
                for name, data in (("run.py", b"print('never runs')\n"), ("../escape.py", b"x = 1\n")):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
            tar, digest = raw_tar(root, buf.getvalue())
            spec = with_workdir(trainer_attempt("wd-evil", NODES[:1], root / "ckpt",
                                                command=("python", "run.py")), tar, digest)
            stage_and_launch(ex, spec)
            events = poll_until(ex, terminal("wd-evil"), what="the traversal job to fail")
            end = state_of(events, "wd-evil")
            assert end.state == AS.ATTEMPT_STATE_FAILED, end
            assert end.exit_code == EXIT_WORKDIR_REFUSED
            assert "'..' in a member name" in end.message and "escape.py" in end.message, end.message
            # nothing landed beside the workdir in the pod's volume
            vols = list(kubelet.root.glob(f"pods/{ns}_*/volumes/shared"))
            assert vols, list(kubelet.root.glob("pods/*"))
            assert not [p for v in vols for p in v.rglob("escape.py")]
    finally:
        ex.shutdown()


def test_a_workdir_without_a_checkpoint_store_is_refused_at_once(cluster_a, kubelet) -> None:
    ex, _ = executor_for(cluster_a)
    try:
        with shared_dir() as root:
            tar, digest = code_tar(root)
            spec = with_workdir(trainer_attempt("wd-nostore", NODES[:1], root,
                                                command=("python", "run.py")), tar, digest)
            spec.checkpoint_uri = ""
            with pytest.raises(ValueError, match="checkpoint store"):
                ex.prepare(spec)
    finally:
        ex.shutdown()
