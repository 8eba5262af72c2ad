"""The memory keepers' Kubernetes objects (pure: no API server; the end-to-end test is
tests/k8s/test_memory_tier_k8s.py) and the ranks' reading of named keepers."""

from __future__ import annotations

import pytest
from kubernetes import client

from region_agents.executors.k8s_keepers import (
    ANNOTATION_NODE,
    keeper_job,
    keeper_port,
    rank_env,
    token_secret,
    token_secret_name,
)
from region_agents.executors.k8s_manifests import rendezvous_port
from trainer.memtier import parse_keepers


def test_keeper_job_is_restricted_pinned_to_its_node_and_bound_to_its_pod_ip() -> None:
    job = keeper_job("Job_With.Odd/Id", "ip-10-0-0-1.ec2.internal", namespace="training",
                     image="img:1", service_account="trainer", run_as_user=1234)
    d = client.ApiClient().sanitize_for_serialization(job)
    assert d["metadata"]["generateName"].startswith("cb-job-with-odd-id-mk-")
    assert d["metadata"]["annotations"][ANNOTATION_NODE] == "ip-10-0-0-1.ec2.internal"
    assert d["spec"]["backoffLimit"] == 0
    pod = d["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    req = term["nodeSelectorTerms"][0]["matchFields"][0]
    assert (req["key"], req["values"]) == ("metadata.name", ["ip-10-0-0-1.ec2.internal"])
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 1234
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert pod["automountServiceAccountToken"] is False
    c = pod["containers"][0]
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}
    port = str(keeper_port("Job_With.Odd/Id"))
    assert c["command"][c["command"].index("--host") + 1] == "$(POD_IP)"  # never loopback
    assert c["command"][c["command"].index("--port") + 1] == port
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    ref = env["CB_MEMORY_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == token_secret_name("Job_With.Odd/Id") and "value" not in env["CB_MEMORY_TOKEN"]
    assert c["readinessProbe"]["tcpSocket"]["port"] == int(port)


def test_token_secret_and_rank_env_keep_the_token_out_of_pod_specs() -> None:
    secret = token_secret("j1", "training")
    assert len(secret.string_data["token"]) == 32
    assert token_secret("j1", "training").string_data != secret.string_data  # fresh per job
    env = {e.name: e for e in rank_env(2, [("n-a", "10.0.0.5:31000"), ("n-b", "10.0.0.6:31000")], "j1")}
    assert env["CB_MEMORY_EVERY"].value == "2"
    assert env["CB_MEMORY_KEEPERS"].value == "n-a=10.0.0.5:31000,n-b=10.0.0.6:31000"
    assert env["CB_MEMORY_TOKEN"].value is None
    assert env["CB_MEMORY_TOKEN"].value_from.secret_key_ref.name == secret.metadata.name
    # names are DNS labels even for long ids, and distinct for ids that sanitize alike
    long = token_secret_name("x" * 200)
    assert len(long) <= 63 and token_secret_name("a_b") != token_secret_name("a.b")


def test_keeper_ports_stay_clear_of_rendezvous_ports_and_the_ephemeral_range() -> None:
    for job in ("a", "b", "job-123", "x" * 80):
        assert 30000 <= keeper_port(job) < 32000
        assert keeper_port(job) != rendezvous_port(job, 1)
        assert rendezvous_port(job, 1) < 30000


def test_named_keepers_are_parsed_in_ring_order() -> None:
    assert parse_keepers(["127.0.0.1:1", "127.0.0.1:2"]) == ([], ["127.0.0.1:1", "127.0.0.1:2"])
    assert parse_keepers(["n0=10.0.0.1:5", "n1=10.0.0.2:5"]) == (["n0", "n1"],
                                                                 ["10.0.0.1:5", "10.0.0.2:5"])
    with pytest.raises(ValueError, match="either every keeper is named"):
        parse_keepers(["n0=10.0.0.1:5", "10.0.0.2:5"])


def test_a_rank_finds_its_keeper_by_its_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which node runs which index is the scheduler's choice: the rank's own keeper is
    its node's (CB_NODE_ID), its buddy the next in the list, whatever its NODE_RANK."""
    from types import SimpleNamespace

    from trainer.memtier import MemoryTier

    said: list[str] = []
    run = SimpleNamespace(log=said.append)
    monkeypatch.setenv("CB_MEMORY_EVERY", "1")
    monkeypatch.setenv("CB_MEMORY_KEEPERS", "n0=10.0.0.1:7,n1=10.0.0.2:7,n2=10.0.0.3:7")
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv("CB_NODE_ID", "n2")
    tier = MemoryTier.from_env(run, manager=None)  # type: ignore[arg-type]
    assert tier is not None and tier.node == 2
    assert tier.own.address == "10.0.0.3:7" and tier.buddy is not None
    assert tier.buddy.address == "10.0.0.1:7"  # the ring wraps
    tier._pool.shutdown()
    monkeypatch.setenv("CB_NODE_ID", "elsewhere")  # a launcher bug: the store tier, said
    assert MemoryTier.from_env(run, manager=None) is None  # type: ignore[arg-type]
    assert "memory tier off" in said[-1] and "elsewhere" in said[-1]


def test_keeper_memory_is_the_tiers_own_bound() -> None:
    """A keeper serves its node's ranks and its ward node's (2 x ranks per node), KEEP
    snapshots each counting the one arriving: that is the request, and with slack for
    larger shards the limit. 100 MiB per rank, 4 ranks per node."""
    from region_agents.executors.k8s_keepers import BASE_BYTES, SLACK, keeper_resources
    from trainer.memkeeper import KEEP

    snap = 100 * 2**20
    r = keeper_resources(snap, 4)
    mib = 2**20
    assert r.requests == {"memory": f"{(BASE_BYTES + KEEP * 8 * snap) // mib}Mi"}  # 1664Mi at KEEP=2
    assert r.limits == {"memory": f"{(BASE_BYTES + int(KEEP * 8 * snap * SLACK)) // mib}Mi"}
    assert KEEP == 2 and r.requests["memory"] == "1664Mi" and r.limits["memory"] == "2064Mi"
    # size unknown: the base request, no limit (a limit would be a guess)
    unknown = keeper_resources(0, 4)
    assert unknown.requests == {"memory": "64Mi"} and not unknown.limits
    # fewer steps kept (--keep 1) need less
    assert keeper_resources(snap, 4, keep=1).requests == {"memory": "864Mi"}


def test_the_snapshot_size_comes_from_the_ranks_report_or_the_jobs_declaration() -> None:
    from region_agents.executors.k8s_keepers import snapshot_bound

    assert snapshot_bound({}, 0) == 0
    assert snapshot_bound({"memory_snapshot_mb": "50"}, 0) == 50_000_000
    assert snapshot_bound({"memory_snapshot_mb": "50"}, 80_000_000) == 80_000_000  # the larger
    assert snapshot_bound({"memory_snapshot_mb": "lots"}, 7) == 7  # a bad value: undeclared
    for bad in ("inf", "-inf", "nan", "1e400"):  # never a traceback in the executor
        assert snapshot_bound({"memory_snapshot_mb": bad}, 7) == 7, bad


def test_the_manifest_carries_the_memory() -> None:
    from region_agents.executors.k8s_keepers import keeper_resources

    job = keeper_job("j", "n0", namespace="t", resources=keeper_resources(10 * 2**20, 1))
    c = client.ApiClient().sanitize_for_serialization(job)["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"requests": {"memory": "104Mi"}, "limits": {"memory": "114Mi"}}
    plain = client.ApiClient().sanitize_for_serialization(keeper_job("j", "n0", namespace="t"))
    assert plain["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"memory": "64Mi"}}
