"""Discrete-event fleet simulator driving the real placement engine and job transitions.

See docs/simulator.md and docs/architecture.md. Entry point: :func:`simulator.run.run`.
"""
