"""brokerctl's daemon commands: serve (a broker), agent (a region agent), demo."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from brokerctl.common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    did_you_mean,
    given_flags,
    kv_pairs,
    load_spec_file,
)
from brokersdk.spec import _pydantic_message


def cmd_serve(args: argparse.Namespace, out: Console) -> int:
    """Build a BrokerConfig from flags (and an optional YAML file) and serve until signalled."""
    from broker.config import BrokerConfig
    from broker.server import serve

    data: dict[str, Any] = {}
    if args.config:
        data.update(load_spec_file(args.config))
    data.update(given_flags(args, (
        ("listen", "listen"),
        ("store", "store"),
        ("checkpoint_root", "checkpoint_root"),
        ("scheduler_interval", "scheduler_interval_s"),
        ("heartbeat_interval", "heartbeat_interval_s"),
        ("agent_timeout", "agent_timeout_s"),
        ("metrics_listen", "metrics_listen"),
        ("agent_listen", "agent_listen"),
        ("tls_cert", "tls_cert"),
        ("tls_key", "tls_key"),
        ("tls_ca", "tls_ca"),
        ("static_tokens", "static_tokens_file"),
        ("insecure_dev", "insecure_dev"),
        ("frontend", "frontend"),
        ("frontend_id", "frontend_id"),
    )))
    for key, value in kv_pairs(args.set, "--set").items():
        data[key] = value
    known = getattr(BrokerConfig, "model_fields", None)
    if known is not None:
        unknown = sorted(k for k in data if k not in known)
        if unknown:
            named = [f"{k} (did you mean {near!r}?)" if (near := did_you_mean(k, known)) else k
                     for k in unknown]
            raise UsageError(f"unknown broker setting(s): {', '.join(named)}")
    try:
        config = BrokerConfig(**data)
    except ValidationError as e:
        raise UsageError(f"bad broker configuration: {_pydantic_message(e)}") from None
    problem = config.tls_problem() or config.frontend_problem()
    if problem:
        raise UsageError(problem)
    try:
        serve(config, ready_file=args.ready_file or "")
    except RuntimeError as e:  # cannot bind, unreadable TLS files: one line, exit 1
        from rich.text import Text

        Console(stderr=True).print(Text(f"error: broker did not start: {e}", style="red"))
        return EXIT_ERROR
    return EXIT_OK


def cmd_agent(argv: list[str], broker_flag: str | None) -> int:
    """Run a region agent: everything after `agent` goes to region_agents.agent.main."""
    from region_agents.agent import main as agent_main

    if broker_flag and "--broker" not in argv and not any(a.startswith("--broker=") for a in argv):
        argv = ["--broker", broker_flag, *argv]
    rc = agent_main(argv)
    return int(rc or 0)


def cmd_demo(args: argparse.Namespace, out: Console) -> int:
    from brokerctl import demo

    return demo.run(args, console=out)
