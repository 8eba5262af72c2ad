"""Jobs: the state machine, its transitions and the event hub that feeds watchers."""
