"""Region agents as the broker sees them: the registry of connected agents and their streams."""
