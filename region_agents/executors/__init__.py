"""Executors: how a region actually runs an attempt (local processes or Kubernetes)."""

from region_agents.executors.base import AttemptEvent, AttemptSpec, Executor, RunningInfo

__all__ = ["AttemptEvent", "AttemptSpec", "Executor", "RunningInfo"]
