"""Checkpoint-portable distributed trainer (see docs/contracts.md and trainer/__main__.py).

Modules, one job each: config (spec + env), model (transformer LM), data (deterministic
world-size-independent order), parallel (process group, mesh, FSDP2/HSDP), storage
(local dir / S3 for DCP), checkpoint (DCP save/load, manifest, retention), progress
(file for the agent), signals (SIGTERM/SIGUSR1 agreement), loop (the training loop).
"""
