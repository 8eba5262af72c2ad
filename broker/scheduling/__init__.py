"""Scheduling: snapshot of the fleet, the placement pass and applying its decisions."""
