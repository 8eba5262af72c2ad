"""`python -m trainer`: one process per rank, launched by the region agent (or torchrun).

Everything comes from the environment (docs/contracts.md section 1). The loop itself is
trainer/loop.py on the public library (trainer/run.py), which produces the exit codes:
0 done, 75 stopped after a durable checkpoint, 2 bad config / checkpoint / storage
(one paragraph on stderr, no traceback), 77 the resume checkpoint is missing (one line),
81 the checkpoint store is down (an outage: the broker waits, one line),
anything else = crash (traceback on stderr).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings

# torch warns at import when numpy is absent, and DCP warns about overwrite defaults;
# neither is actionable for the agent reading our stderr.
warnings.filterwarnings("ignore", message=".*NumPy.*")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed\..*")


class _OneLineFormatter(logging.Formatter):
    """DCP logs to the *root* logger with exc_info (e.g. when it probes a corrupt
    .metadata); keep those as one line so the agent's "last stderr lines" stay readable."""

    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        if record.exc_info:
            record.msg = f"{record.msg} ({record.exc_info[1]})"
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return super().format(record)


def main() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter("trainer: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])

    from trainer.errors import (
        EXIT_AGENT_LEASE_EXPIRED,
        EXIT_BAD_CONFIG,
        EXIT_RESUME_UNAVAILABLE,
        EXIT_STORAGE_FAILED,
        EXIT_STORE_UNAVAILABLE,
        CheckpointSaveError,
        PeerCrashed,
        ResumeUnavailable,
        StoreUnavailable,
        TrainerError,
    )
    from trainer.signals import install_flags

    flags = install_flags()  # first thing: a SIGTERM during startup is remembered, not fatal
    from trainer.agent_lease import start_watchdog

    start_watchdog()  # the agent lost its broker: stop before a relaunch elsewhere trains
    rank = os.environ.get("RANK", "0")
    try:
        from trainer.config import load_run_env, parse_spec
        from trainer.loop import train

        env = load_run_env()
        spec = parse_spec(os.environ.get("CB_TRAINER_CONFIG", ""))
        from trainer.telemetry import traced_attempt

        code = traced_attempt(train, spec, env, flags)  # a span when TRACEPARENT + exporter
    except SystemExit as exc:  # the library's RunExit: 0 done, 75 checkpointed
        code = exc.code if isinstance(exc.code, int) else 1
    except StoreUnavailable as exc:  # an outage, not the job's fault: the broker waits
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_STORE_UNAVAILABLE
    except TrainerError as exc:
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_BAD_CONFIG
    except ResumeUnavailable as exc:  # not a config error: the broker relaunches
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_RESUME_UNAVAILABLE
    except PeerCrashed as exc:  # a peer crashed in an agreed step: its traceback is its own
        print(f"trainer error (rank {rank}): stopping with a peer: {exc}", file=sys.stderr,
              flush=True)
        code = 1
    except CheckpointSaveError as exc:  # storage may recover: the broker relaunches, no node blamed
        print(f"trainer error (rank {rank}): {exc}", file=sys.stderr, flush=True)
        code = EXIT_STORAGE_FAILED
    except Exception as exc:  # noqa: BLE001 - a crash: full traceback for the operator
        from checkpoint_layout.faults import describe, is_outage
        from trainer.agent_lease import lease_expired

        if is_outage(exc):  # the store went down where no caller said so: still an outage
            print(f"trainer error (rank {rank}): checkpoint store unreachable: {describe(exc)}",
                  file=sys.stderr, flush=True)
            code = EXIT_STORE_UNAVAILABLE
        elif lease_expired():  # a peer rank stopped on the agent's expired lease first
            print(f"trainer (rank {rank}): stopping, the agent's lease ran out ({type(exc).__name__}"
                  " from a peer that stopped already)", file=sys.stderr, flush=True)
            code = EXIT_AGENT_LEASE_EXPIRED
        else:
            traceback.print_exc()
            code = 1
    from trainer.parallel import shutdown_and_exit

    shutdown_and_exit(code)


if __name__ == "__main__":
    main()
