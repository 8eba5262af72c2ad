"""Process group, device mesh and FSDP2/HSDP wrapping, leaning on torch.distributed.

Why these choices:
* NCCL + CUDA when a GPU is visible, else gloo + CPU (the local executor's case).
* FSDP2 `fully_shard` on a DeviceMesh: per-block then root, as torchtitan does. HSDP is
  the same call on a 2-D mesh ("replicate", "shard"). Both produce DTensor state that DCP
  reshards on load, which is what makes an N-rank checkpoint load on M ranks.
* A separate gloo group for checkpoint collectives: async DCP on the default group
  interleaves with FSDP's all-gathers and gloo aborts with a "collective mismatch"
  (checked on this machine; torchtitan does the same).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.config import RunEnv, TrainerOptions
from trainer.errors import TrainerError


@dataclasses.dataclass
class Dist:
    device: torch.device
    backend: str
    mesh: DeviceMesh
    ckpt_group: dist.ProcessGroup
    rank: int
    world_size: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(env: RunEnv, opts: TrainerOptions) -> Dist:
    """Init the default group from torchrun-style env; a bare single process also works."""
    if env.world_size == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise TrainerError(f"{var} is not set (needed with WORLD_SIZE={env.world_size})")
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(
        backend=backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=opts.dist_timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    mesh = build_mesh(device.type, env.world_size, opts)
    ckpt_group = dist.new_group(backend="gloo")
    return Dist(device, backend, mesh, ckpt_group, env.rank, env.world_size)


def build_mesh(device_type: str, world_size: int, opts: TrainerOptions) -> DeviceMesh:
    if opts.parallelism == "hsdp":
        rep = opts.hsdp_replicate
        if world_size % rep:
            raise TrainerError(
                f"parallelism=hsdp needs WORLD_SIZE ({world_size}) divisible by "
                f"hsdp_replicate ({rep}); use another hsdp_replicate or fsdp"
            )
        return init_device_mesh(
            device_type, (rep, world_size // rep), mesh_dim_names=("replicate", "shard")
        )
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))


def shard_model(model: nn.Module, d: Dist, opts: TrainerOptions) -> nn.Module:
    """Wrap blocks then root with fully_shard; optional bf16 and activation checkpointing."""
    model.to(d.device)
    if opts.activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        blocks = model.blocks  # type: ignore[attr-defined]
        for i, block in enumerate(list(blocks)):
            blocks[i] = checkpoint_wrapper(block)
    mp = None
    if opts.mixed_precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kwargs = {"mesh": d.mesh}
    if mp is not None:
        kwargs["mp_policy"] = mp
    for block in model.blocks:  # type: ignore[attr-defined]
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shutdown_and_exit(code: int) -> None:
    """destroy_process_group then os._exit: FSDP2+gloo sometimes aborts in normal
    interpreter teardown (exit -6, ~1 run in 10 with DCP; see TRAINER-NOTES)."""
    import sys

    from trainer.errors import EXIT_GRACE_EXCEEDED

    try:
        # past the grace a save thread may still sit in a collective: don't wait on it
        if dist.is_initialized() and code != EXIT_GRACE_EXCEEDED:
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway; the code below is what matters
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
