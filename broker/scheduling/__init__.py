"""Scheduling: snapshot of the fleet, the placement pass, applying its decisions, and
the one usage view built from the same snapshot."""
