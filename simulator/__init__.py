"""Discrete-event fleet simulator driving the real placement engine and job transitions.

See README "Fleet simulator" and docs/architecture.md. Entry point: :func:`simulator.run.run`.
"""
