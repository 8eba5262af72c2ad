"""`brokerctl demo`: the whole system on one machine, in a minute or two.

What it runs, all real: an in-process broker (gRPC on a free loopback port, SQLite
state in the demo work dir), three simulated regions as real `brokerctl agent`
subprocesses (local executor, inventories written into the work dir, a local
checkpoint directory per region), and a handful of small jobs whose ranks are real
`python -m trainer` processes (gloo on CPU) started by those agents.

Why in-process for the broker but subprocesses for agents: the broker is the thing
the demo talks to, so embedding it keeps start-up fast and its logs out of the
way; agents stay separate processes because that is how they run in production
(they dial out to the broker) and so that killing one is realistic.

The story it tells by default (``--no-spot`` skips it): the spot job runs on us-west-2's
spot nodes; once it has a checkpoint those nodes get a reclaim notice; it checkpoints and
moves to eu-west-1, the only capacity left in its allowed regions, on half the world
size, and resumes at the next unseen sample. ``demo_timeline.py`` prints it one line per
event; ``--s3`` keeps the checkpoints in a local S3 server (``demo_s3.py``).

The live view polls GetJob (one cheap call per job and refresh); the summary counts
complete checkpoints on disk (directories holding ``manifest.json``,
docs/contracts.md section 3), so it shows what a user could resume from.

Over 400 lines on purpose: one script-like ``Demo`` run (set up, start, submit, watch,
summarise, tear down) that reads top to bottom; shared cell and table rendering is ``render.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from brokerctl import render
from brokerctl.demo_s3 import LocalS3, S3DemoUnavailable
from brokerctl.demo_timeline import Timeline
from brokersdk.client import (
    TERMINAL_PHASES,
    BrokerClient,
    BrokerError,
    JobHandle,
    JobSpec,
    TrainerSpec,
    phase_name,
)
from computebroker.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[1]

# Region layouts: different sizes and pools so placement has choices to make.
REGIONS: dict[str, dict[str, Any]] = {
    "us-east-2": {
        "zone": "use2-az1",
        "groups": [
            {"name_prefix": "use2-p5", "count": 4, "instance_type": "p5.48xlarge",
             "accelerator": "h100", "gpus": 8, "efa": 32, "capacity_type": "on_demand",
             "price_per_gpu_hour": 4.10, "block": "a"},
        ],
    },
    "us-west-2": {
        "zone": "usw2-az2",
        "groups": [
            {"name_prefix": "usw2-spot", "count": 2, "instance_type": "p5.48xlarge",
             "accelerator": "h100", "gpus": 8, "efa": 32, "capacity_type": "spot",
             "price_per_gpu_hour": 1.60, "interruption_risk": 0.05, "block": "s"},
            {"name_prefix": "usw2-plan", "count": 2, "instance_type": "p5.48xlarge",
             "accelerator": "h100", "gpus": 8, "efa": 32, "capacity_type": "training_plan",
             "price_per_gpu_hour": 2.50, "block": "p"},
        ],
    },
    "eu-west-1": {
        "zone": "euw1-az1",
        "groups": [
            {"name_prefix": "euw1-p4d", "count": 2, "instance_type": "p4d.24xlarge",
             "accelerator": "a100", "gpus": 4, "efa": 4, "capacity_type": "on_demand",
             "price_per_gpu_hour": 3.20, "block": "a"},
            # One H100 node: where the spot job lands after its notice, on half the ranks.
            {"name_prefix": "euw1-p5", "count": 1, "instance_type": "p5.48xlarge",
             "accelerator": "h100", "gpus": 8, "efa": 32, "capacity_type": "on_demand",
             "price_per_gpu_hour": 4.50, "block": "b"},
        ],
    },
}

TEAMS = [
    # team, cohort, guaranteed GPUs (global), borrow limit
    ("research", "ml", 24, 16),
    ("product", "ml", 16, 8),
]


SPOT_JOB = "rl-sweep-spot"


def demo_jobs(steps: int, every: int, sleep: float) -> list[JobSpec]:
    """A handful of small jobs that exercise placement: topology, data locality,
    spot, region preference. All use the tiny model so a laptop runs them; each has
    its own seed and batch size, so each ends at its own loss.

    The spot job tells the headline story: 2 spot nodes in us-west-2, allowed only in
    us-west-2 and eu-west-1 (say, data residency), elastic down to one node. When its
    spot nodes get a reclaim notice it checkpoints, and the only capacity left for it
    is eu-west-1's single H100 node: another region, half the world size."""

    def trainer(seed: int, batch: int, n: int = steps) -> TrainerSpec:
        return TrainerSpec(total_steps=n, checkpoint_every=every, global_batch_size=batch,
                           seed=seed, model="tiny", step_sleep_s=sleep)

    return [  # the story's job first: `--jobs 1` runs just the story
        JobSpec(name=SPOT_JOB, team="research", priority_class="experimentation",
                nodes=2, gpus_per_node=8, accelerator="h100", spot_ok=True,
                capacity_types=["spot", "on-demand"], allowed_regions=["us-west-2", "eu-west-1"],
                min_nodes=1, max_nodes=2, trainer=trainer(37, 8)),
        JobSpec(name="llm-pretrain", team="research", nodes=2, gpus_per_node=8,
                accelerator="h100", topology_required="layer-3", trainer=trainer(11, 16)),
        JobSpec(name="vision-finetune", team="product", priority_class="fine-tuning",
                nodes=1, gpus_per_node=4, accelerator="a100", dataset_uri="s3://datasets-eu/imagenet",
                dataset_region="eu-west-1", trainer=trainer(23, 8)),
        JobSpec(name="eval-harness", team="product", nodes=1, gpus_per_node=2,
                preferred_regions=["us-east-2"], trainer=trainer(41, 4, max(every, steps // 2))),
        JobSpec(name="speech-ft", team="research", priority_class="fine-tuning",
                nodes=2, gpus_per_node=4, accelerator="h100", allowed_regions=["us-east-2", "eu-west-1"],
                preferred_regions=["us-east-2"], trainer=trainer(53, 16)),
    ]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", default="var/demo",
                   help="state, inventories, logs and checkpoints (default ./var/demo; "
                        "its previous demo state is cleared)")
    p.add_argument("--steps", type=int, default=30, help="training steps per job")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step")
    p.add_argument("--ranks-per-node", type=int, default=2,
                   help="trainer processes per simulated node (keep small on few cores)")
    p.add_argument("--jobs", type=int, default=5,
                   help="how many of the demo jobs to submit (1-5; 1 = only the spot job's story)")
    p.add_argument("--timeout", dest="demo_timeout", type=float, default=900.0,
                   help="give up (exit 1) if jobs are not done after this many seconds")
    p.add_argument("--no-spot", dest="spot_demo", action="store_false",
                   help="skip the spot interruption (by default the spot job gets a reclaim notice"
                        " once it has a checkpoint, and moves to another region)")
    p.add_argument("--spot-demo", dest="spot_demo", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--s3", action="store_true",
                   help="checkpoints in a local S3 API server (moto, started and stopped by the"
                        " demo; one bucket per region) instead of local directories")
    p.set_defaults(spot_demo=True)
    p.add_argument("--no-console", action="store_true",
                   help="do not serve the web console beside the demo")
    p.add_argument("--hold", action="store_true",
                   help="keep the broker and console up after the jobs end, until Ctrl-C")
    p.add_argument("--insecure-dev", action="store_true",
                   help="DEV ONLY: run without TLS and authentication (default: TLS with a dev CA)")


# --------------------------------------------------------------------------- processes


@dataclass
class AgentProc:
    region: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as fh:
            # Own session: a terminal Ctrl-C reaches only the demo, which then stops
            # the agents in order (agents stop their trainers on SIGTERM).
            self.popen = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT,
                                          env=env, cwd=str(ROOT), start_new_session=True)

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        if not self.alive():
            return
        assert self.popen is not None
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _kill_leftover_trainers(marker: Path) -> int:
    """SIGKILL trainer processes whose environment points into this demo's work dir:
    the ones an agent that died (or was killed) left behind. Returns how many."""
    needle = str(marker).encode()
    killed = 0
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        try:
            environ = (pid_dir / "environ").read_bytes()
        except OSError:
            continue
        if b"CB_JOB_ID=" in environ and needle in environ:
            with contextlib.suppress(OSError):
                os.kill(int(pid_dir.name), signal.SIGKILL)
                killed += 1
    return killed


@dataclass
class Demo:
    args: argparse.Namespace
    console: Console
    work: Path = field(init=False)
    server: Any = None
    address: str = ""
    agent_address: str = ""  # the broker's mutual-TLS port (agents)
    pki: Any = None  # broker.auth.devca.DevPKI made for this demo (TLS on by default)
    web: Any = None  # console.demo.DemoConsole: the web console beside the demo
    agents: list[AgentProc] = field(default_factory=list)
    handles: list[JobHandle] = field(default_factory=list)
    submitted_at: dict[str, float] = field(default_factory=dict)
    finished_at: dict[str, float] = field(default_factory=dict)
    plan_id: str = ""
    spot_notice_sent: bool = False
    s3: LocalS3 | None = None
    timeline: Timeline | None = None

    def __post_init__(self) -> None:
        self.work = Path(self.args.work_dir).resolve()

    # -- setup

    def prepare_work_dir(self) -> None:
        """Clear what a previous demo left (state, logs, checkpoints) so its jobs do not
        reappear; only our own sub-paths are removed."""
        self.work.mkdir(parents=True, exist_ok=True)
        for name in ("regions", "agents", "inventories", "logs", "checkpoints", "pki"):
            shutil.rmtree(self.work / name, ignore_errors=True)
        for p in self.work.glob("broker.sqlite*"):
            p.unlink(missing_ok=True)
        (self.work / "logs").mkdir(parents=True, exist_ok=True)

    def start_broker(self) -> None:
        from broker.config import BrokerConfig
        from broker.server import BrokerServer

        # Broker logs go to a file: the terminal belongs to the live view.
        logging.basicConfig(filename=str(self.work / "logs" / "broker.log"), level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
        fields = getattr(BrokerConfig, "model_fields", {})
        wanted = {
            "listen": "127.0.0.1:0",
            "store": f"sqlite:///{self.work / 'broker.sqlite'}",
            "checkpoint_root": str(self.work / "checkpoints"),
            "scheduler_interval_s": 0.5,
            "heartbeat_interval_s": 1.0,
            "agent_timeout_s": 15.0,
            "progress_write_interval_s": 0.5,
            "progress_event_every_steps": 5,
            "agent_listen": "127.0.0.1:0",
        }
        if getattr(self.args, "insecure_dev", False):
            wanted["insecure_dev"] = True
        else:  # TLS + auth by default: a dev CA for this demo only, under its work dir
            from broker.auth.devca import create_dev_pki

            self.pki = create_dev_pki(self.work / "pki",
                                      agents=[(r, f"{r}-agent") for r in REGIONS])
            wanted.update(self.pki.broker_settings)
        config = BrokerConfig(**{k: v for k, v in wanted.items() if not fields or k in fields})
        self.server = BrokerServer(config)
        port = self.server.start()
        self.address = f"127.0.0.1:{port}"
        agent_port = getattr(self.server, "agent_port", 0)
        self.agent_address = f"127.0.0.1:{agent_port}" if agent_port else self.address

    def client(self) -> BrokerClient:
        """The demo's own client: the dev CA's operator ("admin"), or plaintext."""
        from brokersdk.credentials import ClientCredentials

        if self.pki is None:
            return BrokerClient(self.address, timeout=15,
                                credentials=ClientCredentials(insecure=True))
        return BrokerClient(self.address, timeout=15, credentials=ClientCredentials(
            ca=str(self.pki.ca.ca_cert_path), token=self.pki.tokens["admin"]))

    def agent_tls_flags(self, region: str) -> list[str]:
        if self.pki is None:
            return ["--insecure-dev"]
        stem = self.pki.ca.root / "agents" / f"{region}-agent"
        return ["--cert", str(stem.with_suffix(".pem")), "--key", str(stem.with_suffix(".key")),
                "--ca", str(self.pki.ca.ca_cert_path)]

    def write_inventory(self, region: str) -> Path:
        layout = REGIONS[region]
        groups = []
        for g in layout["groups"]:
            g = dict(g)
            block = g.pop("block")
            if g["capacity_type"] == "training_plan" and self.plan_id:
                g["training_plan"] = self.plan_id
            g["labels"] = {
                "topology.kubernetes.io/zone": layout["zone"],
                "topology.k8s.aws/network-node-layer-1": f"{region}-spine-1",
                "topology.k8s.aws/network-node-layer-2": f"{region}-l2-1",
                "topology.k8s.aws/network-node-layer-3": f"{region}-l3-{block}",
            }
            groups.append(g)
        inv = {
            "region": region,
            "agent_id": f"{region}-agent",
            "checkpoint_bucket": (f"s3://{self.s3.buckets[region]}" if self.s3 is not None
                                  else str(self.work / "regions" / region / "checkpoints")),
            "node_groups": groups,
        }
        path = self.work / "inventories" / f"{region}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
        return path

    def start_agents(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("OMP_NUM_THREADS", "1")
        env["CB_DEMO_DIR"] = str(self.work)  # marks trainer processes as the demo's
        if self.s3 is not None:
            env.update(self.s3.env)
        for region in REGIONS:
            inv = self.write_inventory(region)
            argv = [
                sys.executable, "-m", "brokerctl", "agent",
                "--broker", self.agent_address,
                *self.agent_tls_flags(region),
                "--region", region,
                "--inventory", str(inv),
                "--agent-id", f"{region}-agent",
                "--work-dir", str(self.work / "agents" / region),
                "--ranks-per-node", str(self.args.ranks_per_node),
                # A root demo runs its toy jobs as root on purpose (private work dir under
                # /tmp); a real agent runs them as --run-as-user (docs/operator/limits.md, "Job user").
                *(["--allow-root-jobs"] if os.geteuid() == 0 else []),
            ]
            proc = AgentProc(region, argv, self.work / "logs" / f"agent-{region}.log")
            proc.start(env)
            self.agents.append(proc)

    def wait_for_agents(self, client: BrokerClient, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        with self.console.status("starting region agents...") as status:
            while True:
                connected = sorted(r.name for r in client.regions() if r.connected)
                status.update(
                    f"waiting for region agents to connect: {len(connected)}/{len(REGIONS)}"
                    + (f" ({', '.join(connected)})" if connected else "")
                )
                if len(connected) >= len(REGIONS):
                    break
                dead = [a for a in self.agents if not a.alive()]
                if dead:
                    raise RuntimeError(
                        f"agent {dead[0].region} exited early; its log ({dead[0].log}):\n"
                        + dead[0].tail()
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"only {len(connected)}/{len(REGIONS)} agents connected after "
                        f"{timeout:.0f}s; see {self.work / 'logs'}"
                    )
                time.sleep(0.3)
        self.console.print(f"[green]✓[/] {len(REGIONS)} regions connected")

    def create_plan(self, client: BrokerClient) -> None:
        """Register the training plan that us-west-2's plan nodes belong to (active now)."""
        now = time.time()
        try:
            plan = client.create_plan(
                name="demo-plan", region="us-west-2", zone=REGIONS["us-west-2"]["zone"],
                instance_type="p5.48xlarge", accelerator="h100", instance_count=2,
                gpus_per_instance=8, start_time=now - 60, end_time=now + 7 * 86400,
                price_per_gpu_hour=2.50,
            )
            self.plan_id = plan.id
        except BrokerError as e:
            self.console.print(f"[yellow]training plan not registered ({e.message}); "
                               "us-west-2 plan nodes stay unnamed[/]")

    def create_teams(self, client: BrokerClient) -> None:
        for team, cohort, gpus, borrow in TEAMS:
            client.set_team_quota(team, cohort=cohort, guaranteed=gpus, borrow_limit=borrow)
        self.console.print(
            "[green]✓[/] teams: "
            + ", ".join(f"{t} ({g} GPUs guaranteed, cohort {c})" for t, c, g, _ in TEAMS)
        )

    def submit(self, client: BrokerClient) -> None:
        specs = demo_jobs(self.args.steps, self.args.checkpoint_every, self.args.step_sleep)
        for spec in specs[: max(1, min(self.args.jobs, len(specs)))]:
            handle = client.submit(spec)
            self.handles.append(handle)
            self.submitted_at[handle.id] = time.time()
        self.console.print(f"[green]✓[/] submitted {len(self.handles)} jobs; the timeline (one "
                           "line per event):")
        self.timeline = Timeline(client, self.console, time.time(),
                                 {h.id: (h.job.spec.name if h.job else h.id) for h in self.handles})

    # -- live view

    def watch(self, client: BrokerClient) -> dict[str, common_pb2.Job]:
        progress = Progress(
            TextColumn("{task.description:<16}", style="bold"),
            TextColumn("{task.fields[phase]:<22}"),
            TextColumn("{task.fields[region]:<10}", style="cyan"),
            BarColumn(bar_width=22),
            TextColumn("{task.completed:>4.0f}/{task.total:<4.0f}"),
            TextColumn("loss {task.fields[loss]:<7}"),
            TimeElapsedColumn(),
            console=self.console,
            refresh_per_second=4,
        )
        tasks = {}
        for h in self.handles:
            name = (h.job.spec.name if h.job else h.id)[:16]
            total = h.job.spec.trainer.total_steps if h.job else 1
            tasks[h.id] = progress.add_task(name, total=total or 1, phase="pending", region="-",
                                            loss="-")
        final: dict[str, common_pb2.Job] = {}
        deadline = time.monotonic() + self.args.demo_timeout
        spot_at = time.monotonic() + 2.0
        with progress:
            while len(final) < len(self.handles):
                for h in self.handles:
                    if h.id in final:
                        continue
                    try:
                        job = h.status()
                    except BrokerError:
                        continue
                    pname = phase_name(job.phase)
                    phase_markup = f"[{render.PHASE_STYLE.get(pname, '')}]{pname}[/]"
                    if job.restarts or job.attempt > 1:
                        phase_markup += f" [dim]#{job.attempt}[/]"
                    progress.update(
                        tasks[h.id],
                        completed=job.progress.step,
                        total=job.progress.total_steps or job.spec.trainer.total_steps or 1,
                        phase=phase_markup,
                        region=job.placement.region or "-",
                        loss=f"{job.progress.loss:.4f}" if job.progress.loss else "-",
                    )
                    if job.phase in TERMINAL_PHASES:
                        final[h.id] = job
                        self.finished_at[h.id] = time.time()
                if self.args.spot_demo and not self.spot_notice_sent and time.monotonic() > spot_at:
                    self.maybe_send_spot_notice(progress)
                if self.timeline is not None:
                    self.timeline.console = progress.console
                    self.timeline.poll()
                dead = [a.region for a in self.agents if not a.alive()]
                if dead:
                    progress.console.print(f"[red]agent(s) exited: {', '.join(dead)}[/]")
                    for a in self.agents:
                        if not a.alive():
                            a.popen = None  # report once
                if time.monotonic() > deadline:
                    progress.console.print(
                        f"[red]timed out after {self.args.demo_timeout:.0f}s; stopping[/]")
                    break
                time.sleep(0.5)
        if self.timeline is not None:
            self.timeline.poll()
        for h in self.handles:
            if h.id not in final:
                with contextlib.suppress(BrokerError):
                    final[h.id] = h.status()
        return final

    def maybe_send_spot_notice(self, progress: Progress) -> None:
        """The spot-interruption hook: a notice file for the node of a running spot job
        (region_agents/signals.py); the broker should checkpoint and move that job."""
        for h in self.handles:
            job = h.job
            if (job is None or job.phase != common_pb2.JOB_PHASE_RUNNING
                    or job.placement.capacity_type != common_pb2.CAPACITY_TYPE_SPOT
                    or job.progress.last_checkpoint_step <= 0):
                continue
            region = job.placement.region
            for n in job.placement.nodes:
                notice = self.work / "agents" / region / "spot-notices" / n.node_id
                notice.parent.mkdir(parents=True, exist_ok=True)
                notice.write_text("20")
            self.spot_notice_sent = True
            progress.console.print(
                f"[bold magenta]>> spot interruption[/]: {region} reclaims the "
                f"{len(job.placement.nodes)} spot node(s) of {job.spec.name} in 20 s",
                no_wrap=True, overflow="ellipsis", crop=True)
            return

    # -- summary

    def checkpoint_dirs(self, job: common_pb2.Job) -> int:
        """Complete checkpoints (dirs with manifest.json) this job left, in any region."""
        if self.s3 is not None:
            c = self.s3.client()
            found_s3: set[str] = set()
            for bucket in self.s3.buckets.values():
                pages = c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"jobs/{job.id}/")
                found_s3 |= {f"{bucket}/{o['Key'].rsplit('/', 1)[0]}" for p in pages
                             for o in p.get("Contents", []) if o["Key"].endswith("manifest.json")}
            return len(found_s3)
        roots = {p for p in (self.work / "regions").glob(f"*/checkpoints/jobs/{job.id}")}
        roots |= {p for p in (self.work / "checkpoints").glob(f"**/{job.id}")}
        uri = job.progress.last_checkpoint_uri
        if uri and not uri.startswith("s3://"):
            roots.add(Path(uri.removeprefix("file://")).parent)
        if job.spec.checkpoint_uri and not job.spec.checkpoint_uri.startswith("s3://"):
            roots.add(Path(job.spec.checkpoint_uri.removeprefix("file://")))
        found = set()
        for r in roots:
            if r.is_dir():
                found |= {m.parent.resolve() for m in r.rglob("manifest.json")}
        return len(found)

    def summary(self, final: dict[str, common_pb2.Job]) -> Table:
        table = Table(title="demo summary", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
                      padding=(0, 1, 0, 0))
        for name, opts in (
            ("JOB", {"max_width": 16}), ("TEAM", {}), ("PHASE", {}), ("REGION", {}),
            ("NODES", {"justify": "right"}), ("STEPS", {"justify": "right"}),
            ("CKPTS", {"justify": "right"}), ("ATTEMPTS", {"justify": "right"}),
            ("LOSS", {"justify": "right"}),
            ("WALL", {"justify": "right"}),
        ):
            table.add_column(name, no_wrap=True, min_width=len(name), **opts)
        for h in self.handles:
            job = final.get(h.id) or h.job
            if job is None:
                continue
            end = job.finished_time or self.finished_at.get(h.id) or time.time()
            start = job.created_time or self.submitted_at.get(h.id, end)
            table.add_row(
                job.spec.name,
                job.spec.team,
                render.phase_text(job.phase),
                job.placement.region or "-",
                f"{len(job.placement.nodes) or job.spec.resources.nodes}"
                f"×{job.spec.resources.gpus_per_node}",
                render.steps(job),
                str(self.checkpoint_dirs(job)),
                str(job.attempt),
                f"{job.progress.loss:.4f}" if job.progress.loss else "-",
                render.duration(end - start),
            )
        return table

    # -- teardown

    def start_console(self) -> str:
        """Serve the web console for this demo's broker on a free loopback port; the line
        to print (URL + the token to sign in with), or "" when it cannot start."""
        if self.pki is None or getattr(self.args, "no_console", False):
            return ""
        try:
            from console.demo import start
        except ImportError:  # a build without the console's dependencies
            return ""
        self.web = start(self.address, str(self.pki.ca.ca_cert_path))
        if self.web is None:
            return ""
        return (f"[green]✓[/] web console: [bold]{self.web.url}[/] "
                f"(sign in with the demo operator's token {self.pki.tokens['admin']}; "
                "it serves while the demo runs)")

    def shutdown(self) -> None:
        if self.web is not None:
            with contextlib.suppress(Exception):
                self.web.stop()
            self.web = None
        if self.agents:
            with self.console.status("stopping agents and trainers..."):
                for a in self.agents:
                    if a.popen is not None and a.popen.poll() is None:
                        a.popen.send_signal(signal.SIGTERM)
                for a in self.agents:
                    a.stop(timeout=20)
                _kill_leftover_trainers(self.work)
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop(1.0)
            self.server = None


def console_hint(address: str, env: str = "") -> str:
    """Where to watch the demo in a browser, when this build has the web console
    (``brokerctl console``, issue 14 part 1); empty otherwise. A console module may offer
    ``demo_url(address) -> str`` to start itself for the demo and return its URL."""
    import importlib

    try:
        mod = importlib.import_module("brokerctl.console")
    except ImportError:
        mod = None
    if mod is None:
        from brokerctl.main import build_parser

        sub = next((a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or "console" not in sub.choices:
            return ""
        return f"watch it in a browser: [bold]{env}brokerctl --broker {address} console[/]"
    demo_url = getattr(mod, "demo_url", None)
    if callable(demo_url):
        with contextlib.suppress(Exception):
            url = demo_url(address)
            if url:
                return f"[green]✓[/] web console: [bold]{url}[/]"
    return f"watch it in a browser: [bold]{env}brokerctl --broker {address} console[/]"


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    """Run the demo; exit status 0 only if every job SUCCEEDED."""
    console = console or Console()
    demo = Demo(args, console)
    t0 = time.time()
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    with contextlib.suppress(ValueError):  # not the main thread (tests): keep defaults
        signal.signal(signal.SIGTERM, on_term)
    if getattr(args, "spot_demo", True) and not args.step_sleep:
        args.step_sleep = 0.2  # slow enough that the move is visible while jobs still run
    try:
        demo.prepare_work_dir()
        console.print(Text.assemble(("Compute Broker demo", "bold"), f"  work dir: {demo.work}"))
        with console.status("starting the broker..."):
            demo.start_broker()
        console.print(f"[green]✓[/] broker on {demo.address} "
                      f"(SQLite: {demo.work / 'broker.sqlite'}; "
                      + ("[bold red]INSECURE dev mode[/])" if demo.pki is None else
                         f"TLS + auth, dev CA in {demo.pki.ca.root})"))
        if demo.pki is not None:
            console.print(f"  [dim]try: CB_CONFIG={demo.pki.client_config} brokerctl --broker"
                          f" {demo.address} jobs[/]")
        if getattr(args, "s3", False):
            with console.status("starting a local S3 API server (moto)..."):
                demo.s3 = LocalS3(list(REGIONS))
                demo.s3.start()
            console.print(f"[green]✓[/] S3 API on {demo.s3.endpoint}: buckets "
                          + ", ".join(f"s3://{b}" for b in demo.s3.buckets.values()))
        with demo.client() as client:
            demo.create_plan(client)
            demo.start_agents()
            demo.wait_for_agents(client)
            console.print(render.capacity_table(client.capacity()))
            demo.create_teams(client)
            env = f"CB_CONFIG={demo.pki.client_config} " if demo.pki is not None else ""
            url_hint = demo.start_console() or console_hint(demo.address, env)
            if url_hint:
                console.print(url_hint)
            if args.spot_demo:
                console.print(f"[magenta]the story[/]: {SPOT_JOB} runs on spot in us-west-2; once "
                              "it has a checkpoint its nodes get a reclaim notice (--no-spot: skip)")
            demo.submit(client)
            final = demo.watch(client)
            migs = client.migrations()
        console.print(demo.summary(final))
        if migs:
            console.print(render.migrations_table(migs, title="migrations"))
            for job in final.values():
                if job.migrations:
                    console.print(Text(f"{job.spec.name}:", style="bold"))
                    console.print(Text("  " + render.move_story(job, job.migrations[-1])),
                                  no_wrap=True, overflow="ellipsis", crop=True)
        if demo.s3 is not None:
            console.print(f"S3: {demo.s3.objects()} objects in the region buckets (the server "
                          "stops with the demo)")
        ok = bool(final) and all(j.phase == common_pb2.JOB_PHASE_SUCCEEDED for j in final.values())
        console.print(
            f"{'[bold green]all jobs succeeded[/]' if ok else '[bold red]not every job succeeded[/]'}"
            f" in {render.duration(time.time() - t0)}; logs and checkpoints under {demo.work}"
        )
        if getattr(args, "hold", False):
            where = f" and the console at {demo.web.url}" if demo.web is not None else ""
            console.print(f"holding the broker on {demo.address}{where}: Ctrl-C ends the demo")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0 if ok else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: shutting down[/]")
        return 130
    except (BrokerError, RuntimeError, OSError, S3DemoUnavailable) as e:
        console.print(f"[red]error:[/] {e}")
        return 1
    finally:
        demo.shutdown()
        if demo.s3 is not None:
            demo.s3.stop()
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, old_term)
