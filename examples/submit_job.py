"""Submit a small training job with the Python SDK and follow it to the end.

    brokerctl serve &                      # or: brokerctl demo
    python examples/submit_job.py --broker 127.0.0.1:50051
"""

from __future__ import annotations

import argparse
import sys

from brokersdk import BrokerClient, BrokerError, JobSpec, TrainerSpec, phase_name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", default="127.0.0.1:50051")
    p.add_argument("--team", default="ml")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args()

    spec = JobSpec(
        name="sdk-example",
        team=args.team,
        nodes=1,
        gpus_per_node=2,
        spot_ok=True,                          # cheaper; the trainer checkpoints anyway
        preferred_regions=["us-east-2"],
        trainer=TrainerSpec(model="tiny", total_steps=40, checkpoint_every=10),
    )
    try:
        with BrokerClient(args.broker) as client:
            # Teams are defined by their quota; make sure ours exists.
            client.set_team_quota(args.team, guaranteed=8)
            job = client.submit(spec)          # retries are safe: a request id is generated
            print(f"submitted {job.id}")
            for event in job.events():         # live history until the job is terminal
                print(f"  {event.type:<12} {phase_name(event.to_phase):<12} "
                      f"{event.region or '-':<10} {event.message}")
            final = job.wait(timeout=args.timeout)
            print(f"{final.id}: {phase_name(final.phase)} in {final.placement.region or '-'} "
                  f"at step {final.progress.step}/{final.progress.total_steps}")
            return 0 if phase_name(final.phase) == "succeeded" else 1
    except BrokerError as e:                   # typed errors carry the gRPC code and message
        print(f"error: {e.message} ({e.code.name if e.code else 'local'})", file=sys.stderr)
        return 2 if e.code is not None and e.code.name == "INVALID_ARGUMENT" else 1


if __name__ == "__main__":
    sys.exit(main())
