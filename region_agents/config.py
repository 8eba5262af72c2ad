"""How one region agent is configured (:class:`AgentConfig`) and the executor it gets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from brokersdk.credentials import ClientCredentials
from checkpoint_layout.roots import canonical
from region_agents.executors.base import Executor
from region_agents.executors.job_user import (
    IdentityPool,
    IdentityScope,
    JobUser,
    JobUserError,
    check_can_run,
    job_user_for,
    parse_uid_range,
)
from region_agents.inventory import Inventory, load_inventory


@dataclass
class AgentConfig:
    """How to run one region agent.

    ``heartbeat_interval_s=None`` means: use the broker's ``RegisterAck`` value
    (2 s until the first ack). ``leader_timeout_s=None``: 4 heartbeat intervals
    (at least 6 s) of silence from the broker mean it hangs: rotate to the next one.
    ``hang_timeout_s``: no trainer heartbeat in the progress file for this long -> the
    attempt is killed and reported FAILED ("hang: ..."); a job can override it with
    trainer option ``hang_timeout_s``.
    """

    broker_address: str
    region: str = ""
    inventory_path: str = ""
    agent_id: str = ""
    work_dir: str = "var/agent"
    executor: str = "local"  # "local" | "kubernetes"
    ranks_per_node: int = 2
    heartbeat_interval_s: float | None = None
    # Re-probe the checkpoint store this often while running (0 = only at start); a
    # failing store is re-probed every store_probe_retry_s so the region comes back soon.
    store_probe_interval_s: float = 30.0
    store_probe_retry_s: float = 2.0
    hang_timeout_s: float = 600.0
    python: str = sys.executable
    extra_env: dict[str, str] = field(default_factory=dict)
    max_backoff_s: float = 5.0
    poll_interval_s: float = 0.2
    shutdown_grace_s: float = 0.0  # on .stop(): >0 = SIGTERM (checkpoint) first
    namespace: str = "default"  # kubernetes executor
    image: str = ""  # kubernetes executor: default trainer image
    # kubernetes executor: the trainer pods' service account ("" = the namespace's
    # default); its preStop hook reads its own pod (checkpoint_layout/pod_deadline.py)
    service_account: str = ""
    # kubernetes executor: the non-root uid (and gid, fsGroup) of the trainer pods
    # (restricted Pod Security Standard); 65532 is the distroless "nonroot" user
    pod_uid: int = 65532
    leader_timeout_s: float | None = None
    # None = 3/4 of the broker's agent_timeout_s (RegisterAck); may only be shorter.
    self_fence_s: float | None = None
    # Local executor: the Unix user ranks run as (region_agents/executors/job_user.py).
    # A root agent without one refuses to start unless allow_root_jobs is set.
    run_as_user: str = ""
    # Local executor: one uid per job from this range (FIRST-LAST), like systemd's
    # DynamicUser; takes the place of run_as_user (job_user.IdentityPool).
    job_uid_range: str = ""
    # Who gets a uid of their own from job_uid_range: "job" (each job) or "team" (each
    # team; its jobs share one, the older scheme). job_user.IdentityScope.
    job_identity: str = "job"
    allow_root_jobs: bool = False
    # Where jobs may choose to write checkpoints in this region (dirs or s3://bucket/prefix),
    # besides the inventory's checkpoint store; advertised to the broker (Register) and
    # checked again at each Launch. Empty and no store: no restriction (a warning).
    checkpoint_allowed_roots: list[str] = field(default_factory=list)
    # Mutual TLS (docs/operator/security.md): this agent's certificate names its region and agent
    # id; the broker's agent port (agent_listen) requires it. Defaults: CB_AGENT_CERT,
    # CB_AGENT_KEY, CB_CA. ``insecure``: plaintext, only for a broker run --insecure-dev.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    insecure: bool = False

    def __post_init__(self) -> None:
        if not self.broker_address:
            raise ValueError("broker_address is required (host:port)")
        self.tls_cert = self.tls_cert or os.environ.get("CB_AGENT_CERT", "")
        self.tls_key = self.tls_key or os.environ.get("CB_AGENT_KEY", "")
        self.tls_ca = self.tls_ca or os.environ.get("CB_CA", "")
        if not self.insecure and not (self.tls_cert and self.tls_key and self.tls_ca):
            raise ValueError("agents connect with mutual TLS: give --cert, --key and --ca (or"
                             " CB_AGENT_CERT/CB_AGENT_KEY/CB_CA; `brokerctl dev-ca DIR` makes"
                             " them), or --insecure-dev for a broker run with --insecure-dev")
        if self.executor not in ("local", "kubernetes"):
            raise ValueError(f"executor must be 'local' or 'kubernetes', got {self.executor!r}")
        if self.executor == "local" and not self.inventory_path:
            raise ValueError("the local executor needs an inventory file (--inventory)")
        if self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        if self.heartbeat_interval_s is not None and self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be > 0")
        if self.pod_uid <= 0:
            raise ValueError(f"pod_uid must be a non-root uid (> 0), got {self.pod_uid}")
        if self.executor == "local" and self.job_uid_range:
            parse_uid_range(self.job_uid_range)  # JobUserError (a ValueError) if malformed
            if self.job_identity not in {s.value for s in IdentityScope}:
                raise JobUserError(f"job_identity {self.job_identity!r}: give"
                                   f" {' or '.join(s.value for s in IdentityScope)}")
            if self.run_as_user:
                raise JobUserError("give run_as_user (one user for every job) or"
                                   " job_uid_range (a uid per job), not both")
            if os.geteuid() != 0:
                raise JobUserError("job_uid_range needs a root agent (it starts ranks as"
                                   " other uids)")
        elif self.executor == "local":  # raises JobUserError (a ValueError) when unsafe
            job_user_for(self.run_as_user, self.allow_root_jobs)
        for root in self.checkpoint_allowed_roots:
            canonical(root)  # RootError (a ValueError): '..', relative, unknown scheme
        self.checkpoint_allowed_roots = [
            r if "://" in r else os.path.abspath(r) for r in self.checkpoint_allowed_roots]
        # Resolve once, here: ranks run in their own attempt directories, where a relative
        # path would name a different place for each of them (issue 11).
        self.work_dir = os.path.abspath(self.work_dir)
        if self.inventory_path:
            self.inventory_path = os.path.abspath(self.inventory_path)


def broker_credentials(config: AgentConfig) -> ClientCredentials:
    """What the agent's channels to the broker present (agent stream, workdir fetches)."""
    return ClientCredentials(ca=config.tls_ca, client_cert=config.tls_cert,
                             client_key=config.tls_key, insecure=config.insecure)


def make_executor(config: AgentConfig) -> tuple[Executor, Inventory]:
    """Build the executor and discover the inventory it runs on."""
    if config.executor == "kubernetes":
        from region_agents.executors.kubernetes import KubernetesExecutor

        ex = KubernetesExecutor(namespace=config.namespace, region=config.region, image=config.image,
                                service_account=config.service_account, run_as_user=config.pod_uid,
                                log_dir=os.path.join(config.work_dir, "k8s-logs"),
                                owners_path=os.path.join(config.work_dir, "checkpoint-owners.json"))
        # (the agent re-adopts the cluster's attempts through ex.recover())
        inv = Inventory(
            region=config.region,
            agent_id=config.agent_id or f"{config.region}-agent",
            nodes=ex.discover_nodes(),
        )
        if config.inventory_path:  # optional: region metadata (checkpoint bucket)
            file_inv = load_inventory(config.inventory_path)
            inv.checkpoint_bucket = file_inv.checkpoint_bucket
        return ex, inv
    from region_agents.executors.local import LocalExecutor

    inv = load_inventory(config.inventory_path)
    identities = None
    if config.job_uid_range:
        first, last = parse_uid_range(config.job_uid_range)
        identities = IdentityPool(first, last, os.path.join(config.work_dir, "identities.json"),
                                  IdentityScope(config.job_identity))
        job_user = None
        probe: JobUser | None = JobUser("probe", first, first)
    else:
        job_user = probe = job_user_for(config.run_as_user, config.allow_root_jobs)
    if probe is not None:
        os.makedirs(config.work_dir, exist_ok=True)
        check_can_run(probe, config.python, config.work_dir)
    root = inv.checkpoint_bucket if inv.checkpoint_bucket and "://" not in inv.checkpoint_bucket else ""
    ex = LocalExecutor(
        config.work_dir,
        ranks_per_node=config.ranks_per_node,
        python=config.python,
        extra_env=config.extra_env,
        hang_timeout_s=config.hang_timeout_s,
        default_checkpoint_root=os.path.join(root, "jobs") if root else "",
        job_user=job_user,
        identities=identities,
        checkpoint_roots=[*config.checkpoint_allowed_roots, *([root] if root else [])],
    )
    return ex, inv
