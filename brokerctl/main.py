"""`brokerctl`: the command line of Compute Broker.

Users: ML engineers (submit / jobs / job / watch / logs / cancel), operators
(capacity / regions / teams / plans / drain / cordon), and daemons (serve, agent).

Why argparse and not click: it is in the standard library, and its subcommand
model is enough; we only override its error path so that bad input prints one
readable line, never a usage dump or a traceback.

Rules every command follows:
* a broker error prints one red line ``error: <message>`` (plus a dim ``hint:``
  line when there is one) on stderr, exit status 2 for bad input (INVALID_ARGUMENT,
  NOT_FOUND, FAILED_PRECONDITION, ...), 1 otherwise (broker unreachable, internal);
* never a Python traceback (set BROKERCTL_DEBUG=1 to see one);
* tables fit 100 columns; ``-o json`` prints the API objects as JSON instead.

This module is the parser and the dispatch (with the one error path); the commands
live by audience in ``commands_jobs.py``, ``commands_operator.py`` and
``commands_daemons.py``, their shared helpers in ``common.py``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from brokerctl import commands_console
from brokerctl.commands_daemons import cmd_agent, cmd_demo, cmd_serve
from brokerctl.commands_jobs import (
    cmd_cancel,
    cmd_events,
    cmd_job,
    cmd_jobs,
    cmd_logs,
    cmd_migrations,
    cmd_resubmit,
    cmd_share,
    cmd_submit,
    cmd_unshare,
    cmd_watch,
)
from brokerctl.commands_operator import (
    cmd_apply,
    cmd_capacity,
    cmd_cordon,
    cmd_drain,
    cmd_plans,
    cmd_priority_classes,
    cmd_regions,
    cmd_teams,
)
from brokerctl.commands_status import cmd_cost, cmd_status, cmd_usage, cmd_wait_ready
from brokerctl.common import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_OK, UsageError, consoles, one_line
from brokerctl.job_ref import resolve_job_id
from brokersdk.client import (
    DEFAULT_ADDRESS,
    AlreadyExists,
    BrokerClient,
    BrokerError,
    InvalidJobSpec,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    QuotaExceeded,
)
from brokersdk.credentials import CredentialsError, resolve
from brokersdk.diagnose import diagnose

BAD_INPUT_ERRORS = (
    InvalidJobSpec,
    NotFound,
    AlreadyExists,
    PreconditionFailed,
    QuotaExceeded,
    PermissionDenied,
)


# --------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise instead of printing usage and exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> _Parser:
    p = _Parser(
        prog="brokerctl",
        description="Compute Broker: submit training jobs once, run them wherever capacity is.",
    )
    p.add_argument(
        "--broker",
        default=None,
        metavar="ADDR",
        help=f"broker address, or HA replicas a:1,b:2 (env CB_SERVER, or the context's server;"
        f" default {DEFAULT_ADDRESS})",
    )
    p.add_argument("--timeout", type=finite_float, default=10.0, help="per-call deadline in seconds")
    p.add_argument("--context", default=None, metavar="NAME",
                   help="client config context (env CB_CONTEXT; config: CB_CONFIG or"
                   " ~/.config/compute-broker/config.yaml)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def add(name: str, help: str, output: bool = False, **kw: Any) -> _Parser:
        sp = sub.add_parser(name, help=help, description=help, **kw)
        if output:
            sp.add_argument("-o", "--output", choices=["table", "json"], default="table")
        return sp

    s = add("submit", "submit a training job", output=True)
    s.add_argument("-f", "--file", help="job spec YAML: flat fields, the API form or a SkyPilot-"
                   "style task file (run, workdir, envs, ...); flags override it; - = stdin")
    s.add_argument("--name")
    s.add_argument("--team")
    s.add_argument("--priority", help="priority class, e.g. training, fine-tuning, inference")
    s.add_argument("--nodes", type=int)
    s.add_argument("--gpus-per-node", type=int)
    s.add_argument("--accelerator", help="e.g. h100 (default: any)")
    s.add_argument("--topology-required", metavar="LEVEL",
                   help="ultraserver | layer-3 | layer-2 | layer-1 | zone | region")
    s.add_argument("--topology-preferred", metavar="LEVEL")
    s.add_argument("--allow-region", action="append", metavar="R[,R]")
    s.add_argument("--deny-region", action="append", metavar="R[,R]")
    s.add_argument("--prefer-region", action="append", metavar="R[,R]")
    s.add_argument("--spot", "--spot-ok", action="store_true", help="spot capacity is acceptable")
    s.add_argument("--capacity-type", action="append", metavar="T[,T]",
                   help="on-demand | spot | training-plan | reserved: the exact set (a spec "
                        "file's spot_ok no longer adds spot; --spot does)")
    s.add_argument("--max-price", type=finite_float, metavar="USD", help="max $ per GPU-hour")
    s.add_argument("--min-nodes", type=int, help="elastic: fewest nodes to resume on")
    s.add_argument("--max-nodes", type=int, help="elastic: most nodes to resume on")
    s.add_argument("--steps", type=int, help="trainer total steps")
    s.add_argument("--checkpoint-every", type=int, metavar="STEPS")
    s.add_argument("--model", help="trainer model preset (tiny, small, ...)")
    s.add_argument("--batch-size", type=int, help="global batch size")
    s.add_argument("--seed", type=int)
    s.add_argument("--step-sleep", type=finite_float, metavar="S", help="simulated extra seconds/step")
    s.add_argument("--trainer-option", action="append", metavar="K=V")
    s.add_argument("--checkpoint-uri", help="file:///path, /abs/path or s3://bucket/prefix")
    s.add_argument("--resume-from", metavar="JOB_OR_URI",
                   help="start from another job's checkpoint (its id: its last durable one;"
                        " or a step directory); it must be shared with your team")
    s.add_argument("--dataset-uri")
    s.add_argument("--dataset-region")
    s.add_argument("--expected-duration", type=finite_float, metavar="S")
    s.add_argument("--image")
    s.add_argument("--env", action="append", metavar="K=V")
    s.add_argument("--label", action="append", metavar="K=V")
    s.add_argument("--request-id", help="idempotency key (default: a new UUID)")
    s.add_argument("--wait", action="store_true", help="follow the job until it finishes")
    s.add_argument("--workdir", metavar="DIR",
                   help="package DIR (honours .brokerignore) and run the command in it")
    s.add_argument("command_argv", nargs="*", metavar="-- CMD",
                   help="your program instead of the built-in trainer (argv, or one quoted"
                   " command line)")
    s.set_defaults(func=cmd_submit)

    s = add("jobs", "list jobs (newest first)", output=True)
    s.add_argument("--team")
    s.add_argument("--phase", action="append", metavar="P[,P]", help="e.g. running,pending")
    s.add_argument("--region")
    s.add_argument("--mine", action="store_true", help="only the jobs I submitted")
    s.add_argument("--limit", type=int, default=None)
    s.add_argument("-w", "--watch", action="store_true",
                   help="refresh every --interval seconds until Ctrl-C")
    s.add_argument("--interval", type=finite_float, default=2.0, metavar="S")
    s.add_argument("--watch-count", type=int, default=0, help=argparse.SUPPRESS)  # tests
    s.set_defaults(func=cmd_jobs)

    s = add("status", "overview: fleet, running jobs, pending jobs and why, spend rate")
    s.add_argument("--team", help="only this team's jobs")
    s.add_argument("--mine", action="store_true", help="only the jobs I submitted")
    s.set_defaults(func=cmd_status)

    s = add("cost", "what jobs cost over a period: per team, user, region or capacity type,"
            " and what moves saved")
    s.add_argument("--since", default="30d", metavar="DURATION", help="e.g. 24h, 7d (default 30d)")
    s.add_argument("--by", choices=["team", "user", "region", "capacity"], default="team")
    s.add_argument("--team", help="only this team's jobs")
    s.set_defaults(func=cmd_cost)

    s = add("usage", "per team over time: queued jobs, admissions, GPUs held and spend (the"
            " console's charts)", output=True)
    s.add_argument("--over", default="1h", metavar="DURATION",
                   help="the window: e.g. 1h, 6h, 24h (at most 24h; default 1h)")
    s.add_argument("--team", help="only this team (members see their own team anyway)")
    s.set_defaults(func=cmd_usage)

    s = add("wait-ready", "wait until the broker answers (and N regions are connected)")
    s.add_argument("--regions", type=int, default=0, metavar="N",
                   help="also wait for N connected regions")
    s.add_argument("--wait-timeout", type=finite_float, default=60.0, metavar="S",
                   help="give up after S seconds (exit 1)")
    s.add_argument("--ready-file", metavar="PATH",
                   help="first wait for the file `serve --ready-file PATH` writes")
    s.set_defaults(func=cmd_wait_ready)

    s = add("resubmit", "submit a new job with another job's spec (clone; the old one is untouched)",
            output=True)
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("--name", help="the new job's name (default: the same name)")
    s.add_argument("--wait", action="store_true", help="follow the new job until it finishes")
    s.set_defaults(func=cmd_resubmit)

    s = add("job", "show one job: spec, placement, progress, goodput, history", output=True)
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.set_defaults(func=cmd_job)

    s = add("migrations", "recent migrations (moves between capacity) with timings", output=True)
    s.add_argument("--job", help="only this job's moves")
    s.add_argument("--team")
    s.add_argument("--limit", type=int, default=None)
    s.set_defaults(func=cmd_migrations)

    s = add("cancel", "cancel a job")
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("--reason")
    s.set_defaults(func=cmd_cancel)

    s = add("share", "let a team's jobs start from a job's checkpoints (resume_from)")
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("--team", default="",
                   help="the team whose jobs may read them (default: the job's own; another"
                        " team needs a team admin)")
    s.set_defaults(func=cmd_share)

    s = add("unshare", "revoke a checkpoint share (SHARE_ID: see `brokerctl job JOB`)")
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("share_id", metavar="SHARE_ID")
    s.set_defaults(func=cmd_unshare)

    s = add("logs", "the ranks' stdout/stderr, attempt by attempt (-f: live)")
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("-f", "--follow", action="store_true",
                   help="keep streaming (across migrations) until the job ends")
    s.add_argument("--rank", type=int, default=None, help="only this rank")
    s.add_argument("--attempt", type=int, default=None, help="only this attempt")
    s.add_argument("--tail", type=int, default=None, help="only the last N lines")
    s.set_defaults(func=cmd_logs)

    s = add("events", "a job's event history, one line each (-f: live)", output=True)
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("-f", "--follow", action="store_true", help="keep going until the job ends")
    s.add_argument("--progress", action="store_true", help="also show step progress events")
    s.set_defaults(func=cmd_events)

    s = add("watch", "follow a job's events live until it finishes")
    s.add_argument("job_id", metavar="JOB", help="id, unique id prefix or name")
    s.add_argument("--progress", action="store_true", help="also show step progress events")
    s.set_defaults(func=cmd_watch)

    s = add("capacity", "capacity per region / zone / pool", output=True)
    s.add_argument("--region")
    s.add_argument("--by-block", action="store_true", help="rows per layer-3 block / UltraServer")
    s.add_argument("--nodes", action="store_true", help="also list nodes")
    s.set_defaults(func=cmd_capacity)

    s = add("regions", "list regions and their agents", output=True)
    s.set_defaults(func=cmd_regions)

    s = add("teams", "list team quotas, or set one (teams set TEAM ...)", output=True)
    tsub = s.add_subparsers(dest="teams_cmd", metavar="[list|get|set]")
    tsub.add_parser("list", help="list teams")
    tg = tsub.add_parser("get", help="show one team")
    tg.add_argument("team")
    ts = tsub.add_parser("set", help="create a team or change only the given fields")
    ts.add_argument("team")
    ts.add_argument("--cohort")
    ts.add_argument("--guaranteed", "--gpus", dest="guaranteed", action="append",
                    metavar="N[:ACCEL]",
                    help="guaranteed GPUs, global across regions (repeat per accelerator)")
    ts.add_argument("--borrow-limit", type=int, metavar="GPUS")
    ts.add_argument("--lend-limit", type=int, metavar="GPUS")
    ts.add_argument("--strategy", help="lend-and-borrow | lend | dont-lend")
    ts.add_argument("--weight", type=finite_float, help="fair-share weight")
    ts.add_argument("--region-cap", action="append", metavar="REGION=GPUS")
    s.set_defaults(func=cmd_teams)

    s = add("priority-classes", "job priority classes: list (default), set, delete", output=True)
    pcsub = s.add_subparsers(dest="pc_cmd", metavar="[list|set|delete]")
    pcsub.add_parser("list", help="list classes, highest value first")
    pcs = pcsub.add_parser("set", help="create a class or change its value/description (operators)")
    pcs.add_argument("name")
    pcs.add_argument("value", type=int, help="higher is admitted first and may preempt lower")
    pcs.add_argument("--description", help="what the class is for")
    pcd = pcsub.add_parser("delete", help="delete a class no live job uses (operators)")
    pcd.add_argument("name")
    s.set_defaults(func=cmd_priority_classes)

    s = add("plans", "training plans: list (default), create, cancel", output=True)
    psub = s.add_subparsers(dest="plans_cmd", metavar="[list|create|cancel]")
    pl = psub.add_parser("list", help="list plans")
    pl.add_argument("--region")
    pl.add_argument("--all", action="store_true", help="include ended / cancelled plans")
    pc = psub.add_parser("create", help="register a training plan")
    pc.add_argument("--name", help="agents' nodes labelled training_plan: NAME belong to it")
    pc.add_argument("--id", dest="plan_id", help="plan id (default: generated)")
    pc.add_argument("--region", required=True)
    pc.add_argument("--zone")
    pc.add_argument("--instance-type")
    pc.add_argument("--accelerator")
    pc.add_argument("--count", type=int, required=True, help="instances")
    pc.add_argument("--gpus-per-instance", type=int, default=8)
    pc.add_argument("--start", default="now", help="now, +2h, epoch or ISO 8601")
    pc.add_argument("--end", help="+48h (after start), epoch or ISO 8601")
    pc.add_argument("--duration", default="24h", help="if no --end: 24h, 90m, 1d2h, ...")
    pc.add_argument("--team")
    pc.add_argument("--price", type=finite_float, help="$ per GPU-hour (prepaid)")
    pc.add_argument("--force", action="store_true",
                    help="register it even if no agent's node can back it yet")
    pcc = psub.add_parser("cancel", help="cancel a plan")
    pcc.add_argument("plan_id")
    s.set_defaults(func=cmd_plans, region=None, all=False)

    s = add("apply", "declare teams/quotas, priority classes and training plans in a file:"
            " show the diff, apply it")
    s.add_argument("-f", "--file", required=True,
                   help="fleet YAML (teams:, priority_classes:, plans:); - = stdin")
    s.add_argument("--dry-run", action="store_true", help="only show the diff")
    s.set_defaults(func=cmd_apply)

    s = add("drain", "drain a region (move its jobs out), or --undrain")
    s.add_argument("region")
    s.add_argument("--undrain", action="store_true")
    s.add_argument("--reason")
    s.set_defaults(func=cmd_drain)

    s = add("cordon", "cordon a node (no new work), or --undo")
    s.add_argument("node")
    s.add_argument("--undo", action="store_true")
    s.set_defaults(func=cmd_cordon)

    # `plans create ... -o json` and `teams set ... -o json` read as people type them:
    # the sub-subcommands accept -o too (SUPPRESS: the parent's default stays).
    for sp in (tsub, psub, pcsub):
        for child in sp.choices.values():
            child.add_argument("-o", "--output", choices=["table", "json"], default=argparse.SUPPRESS)

    from brokerctl import commands_auth

    commands_auth.add_parsers(add)

    s = add("serve", "run the broker (blocks until SIGINT/SIGTERM)")
    s.add_argument("--config", help="YAML file of BrokerConfig fields")
    s.add_argument("--listen", help="host:port (default 127.0.0.1:50051)")
    s.add_argument("--store", help="sqlite:///path or redis://host:port/db")
    s.add_argument("--checkpoint-root", help="default checkpoint location for jobs")
    s.add_argument("--scheduler-interval", type=finite_float, metavar="S")
    s.add_argument("--heartbeat-interval", type=finite_float, metavar="S")
    s.add_argument("--agent-timeout", type=finite_float, metavar="S")
    s.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics on /metrics here (default off; HTTPS)")
    s.add_argument("--agent-listen", metavar="HOST:PORT",
                   help="the mutual-TLS port for agents and certificate users (default :50052)")
    s.add_argument("--tls-cert", help="the broker's certificate (PEM)")
    s.add_argument("--tls-key", help="its private key (PEM)")
    s.add_argument("--tls-ca", help="the CA that signs agents' and users' certificates (PEM)")
    s.add_argument("--static-tokens", metavar="FILE", help="bootstrap tokens (from dev-ca)")
    s.add_argument("--insecure-dev", action="store_true", default=None,
                   help="DEV ONLY: no TLS, no auth, loopback only, every caller is operator")
    s.add_argument("--frontend", action="store_true", default=None,
                   help="an API front-end on the shared Redis store: serves submits, job"
                        " reads and WatchJob, sends other calls on to the leader; never"
                        " leads or schedules")
    s.add_argument("--frontend-id", type=int, metavar="N",
                   help="distinct per front-end, 0..191 (its job ids' stream)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", help="any BrokerConfig field")
    s.add_argument("--ready-file", metavar="PATH",
                   help="write PATH (JSON: address, ports, pid) once the broker takes calls;"
                        " removed when it stops")
    s.set_defaults(local=cmd_serve)

    s = add("console", "serve the web console (fleet, queue, jobs, migrations, plans)")
    commands_console.add_arguments(s)
    s.set_defaults(local=commands_console.cmd_console)

    s = add("completion", "print a shell completion script: eval \"$(brokerctl completion bash)\"")
    s.add_argument("shell", choices=["bash", "zsh", "fish"])
    s.set_defaults(local=_cmd_completion)

    add("agent", "run a region agent (all further arguments go to the agent; see agent --help)")

    s = add("demo", "embedded broker, 3 simulated regions, real training jobs; a spot job moves region")
    from brokerctl import demo

    demo.add_arguments(s)
    s.set_defaults(local=cmd_demo)

    s = add("sim", "replay a job trace on a simulated fleet under several scheduling policies")
    from brokerctl import commands_sim

    commands_sim.add_arguments(s)
    s.set_defaults(local=commands_sim.cmd_sim)
    return p


_GLOBAL_WITH_VALUE = {"--broker", "--timeout", "--context"}


def _split_agent_argv(argv: list[str]) -> tuple[list[str], list[str]] | None:
    """If the command is `agent`, return (global argv, agent argv): the agent's own
    flags must reach it untouched, so argparse never sees them."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in _GLOBAL_WITH_VALUE:
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        if tok == "agent":
            return argv[:i], argv[i + 1 :]
        return None
    return None


def finite_float(text: str) -> float:
    """argparse type: a finite number ("nan", "inf" and 1e400 are refused, exit 2)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


finite_float.__name__ = "finite number"  # argparse: "invalid finite number value: 'nan'"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `brokerctl`; returns the exit status (never raises on user errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = consoles()
    debug = bool(os.environ.get("BROKERCTL_DEBUG"))
    address = DEFAULT_ADDRESS
    try:
        parser = build_parser()
        split = _split_agent_argv(argv)
        if split is not None:
            gargs = parser.parse_args([*split[0], "regions"])
            return cmd_agent(
                split[1], gargs.broker or os.environ.get("BROKER_ADDRESS") or DEFAULT_ADDRESS
            )
        args = parser.parse_args(argv)
        if not getattr(args, "cmd", None):
            parser.print_help()
            return EXIT_BAD_INPUT
        if hasattr(args, "local"):
            return args.local(args, out)
        try:
            creds = resolve(context=args.context or "")
        except CredentialsError as e:
            raise UsageError(str(e)) from None
        address = (args.broker or os.environ.get("BROKER_ADDRESS") or creds.server
                   or DEFAULT_ADDRESS)
        with BrokerClient(address, timeout=args.timeout, credentials=creds) as client:
            try:
                _resolve_job_refs(args, client)
                return args.func(args, client, out)
            except BrokerError as e:
                # Say what to change (CB_SERVER, CB_INSECURE, CB_CA, CB_TOKEN, CB_CONFIG),
                # not what gRPC saw: brokersdk/diagnose.py.
                raise diagnose(e, address, creds) from None
    except SystemExit as e:  # --help, or a delegated main() calling sys.exit
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_ERROR)
    except UsageError as e:
        _error(err, with_suggestion(str(e), argv))
        return EXIT_BAD_INPUT
    except CredentialsError as e:  # e.g. CB_CA names a file that is gone: says which
        _error(err, str(e), "check CB_CA / CB_CLIENT_CERT, or the context in CB_CONFIG")
        return EXIT_BAD_INPUT
    except BrokerError as e:
        _error(err, e.message, e.hint)
        if debug:
            traceback.print_exc()
        return EXIT_BAD_INPUT if isinstance(e, BAD_INPUT_ERRORS) else EXIT_ERROR
    except TimeoutError as e:
        _error(err, str(e))
        return EXIT_ERROR
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        # Values the spec builder or protobuf refuse (out of int32 range, wrong type,
        # pydantic's multi-line report): the input's fault, said on one line, exit 2.
        _error(err, f"invalid input: {one_line(e)}")
        if debug:
            traceback.print_exc()
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        err.print("[dim]interrupted[/]")
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # last resort: one line, never a traceback (unless debugging)
        _error(err, f"unexpected {type(e).__name__}: {e}", "set BROKERCTL_DEBUG=1 for details")
        if debug:
            traceback.print_exc()
        return EXIT_ERROR


def _cmd_completion(args: argparse.Namespace, out: Console) -> int:
    from brokerctl.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return EXIT_OK


def with_suggestion(message: str, argv: list[str]) -> str:
    """argparse's "unrecognized arguments: --stpes 5" / "invalid choice: 'sumbit'" with a
    did-you-mean from the options of the command that was typed (Python 3.11's argparse
    has none of its own)."""
    import difflib

    parser = build_parser()
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    if sub is None:
        return message
    if "invalid choice:" in message:
        bad = message.split("invalid choice:", 1)[1].split("'")[1] if "'" in message else ""
        near = difflib.get_close_matches(bad, list(sub.choices), n=1)
        return message + (f"; did you mean {near[0]!r}?" if near else "")
    if "unrecognized arguments:" not in message:
        return message
    cmd = next((a for a in argv if a in sub.choices), None)
    target = sub.choices[cmd] if cmd else parser
    options = [o for a in target._actions for o in a.option_strings if o.startswith("--")]
    options += [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    listed = message.split("unrecognized arguments:", 1)[1].split(" (see `", 1)[0]
    bad = [t.split("=", 1)[0] for t in listed.split() if t.startswith("--")]
    hints = [f"{b} -> {near[0]}" for b in bad
             if (near := difflib.get_close_matches(b, options, n=1, cutoff=0.6))]
    return message + (f"; did you mean {', '.join(hints)}?" if hints else "")


def _resolve_job_refs(args: argparse.Namespace, client: BrokerClient) -> None:
    """Jobs by id, unique id prefix or name (brokerctl/job_ref.py), for every command
    that takes one: the positional JOB and `migrations --job`."""
    for attr in ("job_id", "job"):
        ref = getattr(args, attr, None)
        if isinstance(ref, str) and ref:
            setattr(args, attr, resolve_job_id(client, ref))


def _error(err: Console, message: str, hint: str | None = None) -> None:
    line = Text("error: ", style="bold red")
    line.append(message, style="red")
    err.print(line, soft_wrap=True)
    if hint:
        err.print(Text(f"hint: {hint}", style="dim"), soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
