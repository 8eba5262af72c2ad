"""The progress users see is monotone: one rule, applied where attempts begin.

Why: after a relaunch the broker showed the new attempt at step 0 (its first reports come
before it loads its checkpoint) while its durable checkpoint was at step 37; users saw
the job go backwards below work that is safe. Every path that starts a new attempt (a
placement: :func:`broker.jobs.transitions.admit`; a make-before-break go:
:func:`broker.jobs.standby.promote`) calls :func:`start_at_resume_step`, and
:func:`broker.jobs.updates.apply_progress` never lets a report lower the step.
"""

from __future__ import annotations

from computebroker.v1 import common_pb2 as pb


def start_at_resume_step(job: pb.Job) -> None:
    """A new attempt starts at its resume step: the job shows the step of the checkpoint
    it resumes from (0 without one), not the lost steps of the attempt before, and its
    reports before the load (step 0) never show less (updates.apply_progress).

    samples_seen is scaled with the step (a fixed global batch); the loss is the last
    one reported until the new attempt reports its own."""
    p = job.progress
    step = p.last_checkpoint_step if p.last_checkpoint_uri else 0
    if p.step > 0 and step < p.step:
        p.samples_seen = p.samples_seen * step // p.step
    p.step = step
