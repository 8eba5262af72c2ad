"""The region agent daemon: one per cluster.

It dials out to the broker (regions need no inbound ports), registers its
inventory, runs what the broker assigns through an executor (local processes
or Kubernetes Jobs) and reports health, spot notices and progress.
Entry point: :func:`region_agents.agent.main` (``brokerctl agent``).
"""
