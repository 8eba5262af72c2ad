"""brokerctl's commands for ML engineers: submit, jobs, job, migrations, cancel, logs, events, watch."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from rich.console import Console
from rich.text import Text

from brokerctl import render, render_logs
from brokerctl.common import (
    EXIT_OK,
    UsageError,
    csv_values,
    given_flags,
    kv_pairs,
    load_spec_file,
    print_line,
    show_list,
)
from brokerctl.live_progress import LiveProgress
from brokersdk.client import TERMINAL_PHASES, BrokerClient, JobSpec, phase_name
from brokersdk.taskfile import TaskFileError, from_task_file, is_task_file


def cmd_submit(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    base = load_spec_file(args.file) if args.file else {}
    if is_task_file(base):  # SkyPilot-style task file (brokersdk/taskfile.py)
        try:
            base = from_task_file(base)
        except TaskFileError as e:
            raise UsageError(f"spec file {args.file}: {e}") from None
    flag_map = {
        "name": "name",
        "team": "team",
        "priority": "priority_class",
        "nodes": "nodes",
        "gpus_per_node": "gpus_per_node",
        "accelerator": "accelerator",
        "topology_required": "topology_required",
        "topology_preferred": "topology_preferred",
        "max_price": "max_price_per_gpu_hour",
        "min_nodes": "min_nodes",
        "max_nodes": "max_nodes",
        "checkpoint_uri": "checkpoint_uri",
        "resume_from": "resume_from",
        "dataset_uri": "dataset_uri",
        "dataset_region": "dataset_region",
        "expected_duration": "expected_duration_s",
        "image": "image",
    }
    overrides = given_flags(args, flag_map.items())
    for flag, field in (
        ("allow_region", "allowed_regions"),
        ("deny_region", "denied_regions"),
        ("prefer_region", "preferred_regions"),
        ("capacity_type", "capacity_types"),
    ):
        if getattr(args, flag):
            overrides[field] = csv_values(getattr(args, flag))
    if args.capacity_type:
        # The flag names the exact set: a spec file's `spot_ok: true` would otherwise add
        # spot to it behind the user's back (list spot, or add --spot, to allow it).
        overrides["spot_ok"] = False
    if args.spot:
        overrides["spot_ok"] = True
    if args.env:
        overrides["env"] = kv_pairs(args.env, "--env")
    if args.label:
        overrides["labels"] = kv_pairs(args.label, "--label")
    if args.command_argv:
        argv = list(args.command_argv)
        # One quoted argument with spaces is a command line: split it like a shell would.
        overrides["run"] = argv[0] if len(argv) == 1 and " " in argv[0] else argv
        base.pop("command", None)
    if args.workdir is not None:
        overrides["workdir"] = args.workdir
    trainer = given_flags(args, (
        ("steps", "total_steps"),
        ("checkpoint_every", "checkpoint_every"),
        ("model", "model"),
        ("batch_size", "global_batch_size"),
        ("seed", "seed"),
        ("step_sleep", "step_sleep_s"),
    ))
    if args.trainer_option:
        trainer["options"] = kv_pairs(args.trainer_option, "--trainer-option")

    team_given = bool(base.get("team")) or "team" in overrides
    if "resources" in base or "topology" in base:  # the API's JSON form
        if overrides or trainer:
            raise UsageError(
                "flags cannot be combined with a spec file in the API's JSON form "
                "(resources: ...); use the flat form (nodes:, gpus_per_node:, ...)"
            )
        spec: Any = JobSpec.from_dict(base)
    else:
        merged = {**base, **overrides}
        if trainer:
            merged["trainer"] = {**(base.get("trainer") or {}), **trainer}
        spec = JobSpec.from_dict(merged)
    if not team_given:  # after the spec is checked: a typo never waits for the broker
        team = default_team(client)
        if team:
            spec.team = team

    handle = _submit_with_progress(client, spec, args.request_id)
    job = handle.job
    if args.output == "json":
        out.print_json(render.to_json(job))
    else:
        verb = "submitted" if handle.created is not False else "already submitted (same request id)"
        line = Text(f"{verb} job ")
        line.append(handle.id, style="bold")
        if job is not None and job.spec.name:
            line.append(f" ({render.escape_controls(job.spec.name)})")
        if job is not None:
            line.append(" — ")
            line.append_text(render.phase_text(job.phase))
            if job.pending_reason:
                line.append(f": {render.escape_controls(job.pending_reason)}", style="yellow")
        out.print(line)
        if job is not None and job.spec.HasField("workdir") and job.spec.workdir.size_bytes:
            out.print(f"[dim]workdir uploaded: {render.size_text(job.spec.workdir.size_bytes)}"
                      f" ({job.spec.workdir.digest[:19]}; .gitignore and .brokerignore"
                      " honoured)[/]")
        if not args.wait:
            out.print(
                f"[dim]follow it: brokerctl watch {handle.id}   details: brokerctl job {handle.id}[/]"
            )
    if args.wait:
        return _watch(client, handle.id, out, include_progress=False)
    return EXIT_OK


def default_team(client: BrokerClient) -> str:
    """The caller's team when neither ``--team`` nor the spec names one: a member or
    team admin belongs to exactly one team (their token or certificate says which), so
    that team is the only sensible default; operators have none ("" = the SDK's own
    default). Why ask the broker: the identity lives in the credential, not the client."""
    return client.whoami().team


def _submit_with_progress(client: BrokerClient, spec: Any, request_id: str | None) -> Any:
    """Submit; when a local workdir is uploaded first, show a progress bar on stderr."""
    if not (isinstance(spec, JobSpec) and spec.workdir and not spec.workdir.startswith("sha256:")):
        return client.submit(spec, client_request_id=request_id)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("uploading workdir"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("upload", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return client.submit(spec, client_request_id=request_id, workdir_progress=progress)


def cmd_jobs(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    if args.limit is not None and args.limit < 0:
        raise UsageError(f"--limit must be >= 0, got {args.limit}")
    if args.watch and args.interval <= 0:
        raise UsageError(f"--interval must be more than 0, got {args.interval}")
    owner = my_actor(client) if args.mine else ""

    def listed() -> list:
        # The broker lists by id; newest first needs them all, then --limit keeps the newest.
        jobs = client.jobs(team=args.team or "", phases=csv_values(args.phase),
                           region=args.region or "")
        return render.newest_first([j for j in jobs if not owner or j.owner == owner], args.limit)

    if not args.watch:
        return show_list(args, out, listed(), "[dim]no jobs[/]",
                         lambda js: render.jobs_view(js, width=out.width))
    shown = 0
    while True:  # `jobs -w`: the table again every --interval s (Ctrl-C ends it, exit 130)
        jobs = listed()
        if out.is_terminal:
            out.clear()
        out.print(Text(f"every {args.interval:g}s · {time.strftime('%H:%M:%S')} · "
                       f"{len(jobs)} job(s) · Ctrl-C to stop", style="dim"))
        show_list(args, out, jobs, "[dim]no jobs[/]",
                  lambda js: render.jobs_view(js, width=out.width))
        shown += 1
        if args.watch_count and shown >= args.watch_count:
            return EXIT_OK
        time.sleep(args.interval)


def my_actor(client: BrokerClient) -> str:
    """How the broker names me as a job's owner (Job.owner): ``user:NAME``, or
    ``insecure-dev`` on a dev broker (broker/auth/identity.py ``Principal.actor``)."""
    me = client.whoami()
    return "insecure-dev" if me.credential == "insecure-dev" else f"user:{me.name}"


def cmd_job(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    job = client.get_job(args.job_id)
    events = client.events(args.job_id)
    if args.output == "json":
        import json

        data = {
            "job": json.loads(render.to_json(job)),
            "events": json.loads(render.to_json(events)),
        }
        out.print_json(json.dumps(data))
        return EXIT_OK
    print_job(out, render.scrub(job), render.scrub(list(events)))
    return EXIT_OK


def print_job(out: Console, job: Any, events: list, now: float | None = None) -> None:
    """``brokerctl job ID``: the story in one line, the detail panels, then the events one
    line each (progress events left to ``brokerctl events ID --progress``)."""
    out.print(render.job_detail(job, None, now=now))
    shown = [e for e in events if e.type != "progress"]
    out.print(Text(f"events ({len(shown)}, one line each; in full: brokerctl events {job.id})",
                   style="bold"))
    for event in shown:
        print_line(out, render_logs.event_line(event))


def cmd_resubmit(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """A new job from an existing job's spec (its workdir by digest: no upload). Why a
    copy of the spec and not a restart: the old job's history, goodput and checkpoints
    stay as they were; the new one starts from the beginning under a new id."""
    old = client.get_job(args.job_id)
    spec = type(old.spec)()
    spec.CopyFrom(old.spec)
    if args.name:
        spec.name = args.name
    # that prefix is the old job's: a job writes only under its own (the new one gets the
    # region store's default; its resume_from, if any, is checked again)
    moved_ckpt = spec.checkpoint_uri
    spec.checkpoint_uri = ""
    handle = client.submit(spec)
    job = handle.job
    if args.output == "json":
        out.print_json(render.to_json(job))
    else:
        line = Text("submitted job ")
        line.append(handle.id, style="bold")
        line.append(f" ({render.escape_controls(spec.name)}) from {old.id} — ")
        line.append_text(render.phase_text(job.phase) if job is not None else Text("?"))
        out.print(line)
        if moved_ckpt:
            out.print(Text(f"checkpoints: the region's store, not {moved_ckpt} (that is {old.id}'s)",
                           style="dim"), soft_wrap=True)
    if args.wait:
        return _watch(client, handle.id, out, include_progress=False)
    return EXIT_OK


def cmd_migrations(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """Recent migrations: cause (! = emergency), route, world sizes, timing breakdown."""
    migs = client.migrations(job_id=args.job or "", team=args.team or "", limit=args.limit or 0)
    return show_list(args, out, migs, "no migrations yet", render.migrations_table)


def cmd_cancel(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    job = client.cancel(args.job_id, args.reason or "cancelled from brokerctl")
    line = Text(f"job {job.id}: ")
    line.append_text(render.phase_text(job.phase))
    if job.phase not in TERMINAL_PHASES:
        line.append(" (stopping)", style="dim")
    out.print(line)
    return EXIT_OK


def cmd_share(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    share = client.share_checkpoints(args.job_id, args.team)
    out.print(Text(f"job {share.job_id}: checkpoints shared with team {share.grantee_team}"
                   f" ({share.id}, by {share.granted_by})"), soft_wrap=True)
    out.print(Text(f"its jobs may start from them: brokerctl submit --resume-from {share.job_id}"
                   f" ...; revoke: brokerctl unshare {share.job_id} {share.id}"), soft_wrap=True)
    return EXIT_OK


def cmd_unshare(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    share = client.revoke_checkpoint_share(args.job_id, args.share_id)
    out.print(Text(f"job {share.job_id}: share {share.id} with team {share.grantee_team}"
                   f" revoked (by {share.revoked_by})"), soft_wrap=True)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """The ranks' own output, attempt by attempt (a separator line each)."""
    with_rank = args.rank is None
    shown = 0
    for rec in client.logs(args.job_id, follow=args.follow, rank=args.rank,
                           attempt=args.attempt, tail=args.tail):
        kind = rec.WhichOneof("kind")
        if kind == "attempt":
            with_rank = args.rank is None and (rec.attempt.ranks or rec.attempt.world_size) != 1
            out.print(render_logs.attempt_separator(render.scrub(rec.attempt)), soft_wrap=True)
        elif kind == "dropped_lines":
            out.print(render_logs.dropped(rec.dropped_lines), soft_wrap=True)
        else:
            shown += 1
            out.print(render_logs.log_line(render.scrub(rec.line), with_rank), soft_wrap=True)
    if not shown and not args.follow:
        out.print(f"[dim]no output from {args.job_id} yet[/]")
    return EXIT_OK


def cmd_events(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    """The job's history, one line per event with local times (``-f``: live)."""
    if args.follow:
        client.get_job(args.job_id)  # NOT_FOUND early, with the usual message
        return _watch(client, args.job_id, out, include_progress=args.progress)
    events = [e for e in client.events(args.job_id)
              if args.progress or e.type != "progress"]
    if args.output == "json":
        out.print_json(render.to_json(events))
        return EXIT_OK
    for event in events:
        out.print(render_logs.event_line(render.scrub(event)))
    return EXIT_OK


def _watch(client: BrokerClient, job_id: str, out: Console, include_progress: bool) -> int:
    """Event lines as they happen, plus live progress (step/total, loss, region, world
    size): a status line on a terminal, a line per ~10% of the steps otherwise (or every
    progress event with ``--progress``)."""
    live = LiveProgress(client.get_job(job_id))
    status = out.status(live.text()) if out.is_terminal else None
    stop = threading.Event()
    if status is not None:
        status.start()
        threading.Thread(target=_poll_status, args=(client, job_id, live, status, stop),
                         daemon=True).start()
    try:
        for event in map(render.scrub, client.watch(job_id, include_progress=True)):
            changed = live.update(event)
            if event.type == "progress":
                if status is not None:
                    status.update(live.text())
                elif include_progress or changed:
                    out.print(Text(f"  {live.text()}", style="dim"))
                continue
            out.print(render_logs.event_line(render.scrub(event)))
            if status is not None:
                status.update(live.text())
    finally:
        stop.set()
        if status is not None:
            status.stop()
    job = client.get_job(job_id)
    final = Text("final: ")
    final.append_text(render.phase_text(job.phase))
    if job.message:
        final.append(f" — {render.escape_controls(job.message)}")
    out.print(final)
    return EXIT_OK if job.phase in TERMINAL_PHASES and phase_name(job.phase) != "failed" else 1


def _poll_status(client: BrokerClient, job_id: str, live: LiveProgress, status: Any,
                 stop: threading.Event, every_s: float = 2.0) -> None:
    """On a terminal: refresh the status line from GetJob between progress events."""
    while not stop.wait(every_s):
        try:
            live.refresh(client.get_job(job_id))
        except Exception:  # the event stream reports real trouble; this is cosmetic
            continue
        status.update(live.text())


def cmd_watch(args: argparse.Namespace, client: BrokerClient, out: Console) -> int:
    client.get_job(args.job_id)  # NOT_FOUND early, with the usual message
    return _watch(client, args.job_id, out, include_progress=args.progress)
