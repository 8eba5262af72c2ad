"""Real Kubernetes control planes for the tests (see tests/fixtures/k8s/controlplane.py):
two per session, ``cluster_a`` and ``cluster_b`` -- two clusters are two regions. Tests
keep out of each other's way with a namespace each (:func:`namespace`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.fixtures.k8s.controlplane import ControlPlane


@pytest.fixture(scope="session")
def cluster_a() -> Iterator[ControlPlane]:
    cp = ControlPlane(name="cluster-a").start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def cluster_b() -> Iterator[ControlPlane]:
    cp = ControlPlane(name="cluster-b").start()
    try:
        yield cp
    finally:
        cp.stop()


def make_namespace(cp: ControlPlane, prefix: str = "t", restricted: bool = True) -> str:
    """A fresh namespace; ``restricted``: Pod Security admission enforces the
    *restricted* standard on it, as deploy/k8s does for trainer namespaces."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    labels = {"pod-security.kubernetes.io/enforce": "restricted"} if restricted else {}
    cp.core().create_namespace({"metadata": {"name": name, "labels": labels}})
    return name


@pytest.fixture
def namespace(cluster_a: ControlPlane) -> str:
    return make_namespace(cluster_a)
