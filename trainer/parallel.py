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
import enum
import os
import socket
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.config import RunEnv, TrainerOptions
from trainer.errors import EXIT_RENDEZVOUS_PORT_TAKEN, TrainerError, record_exit


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


class Parallelism(enum.StrEnum):
    """How parameters are laid out over the ranks (a DeviceMesh FSDP2 shards over)."""

    AUTO = "auto"  # HSDP (nodes x local ranks) when the job spans nodes, else FSDP
    FSDP = "fsdp"  # 1-D mesh: every rank holds 1/world of every parameter
    HSDP = "hsdp"  # 2-D mesh ("replicate", "shard"): shard inside a group, replicate across


def init_process_group(
    rank: int, world_size: int, local_rank: int, timeout_s: float
) -> tuple[torch.device, str]:
    """The default group from torchrun-style env; a bare single process also works.

    NCCL on the rank's GPU when CUDA exists, else gloo on CPU (the local executor's case).
    Returns (device, backend). Does nothing but pick the device if a group already exists.
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if dist.is_initialized():
        return device, dist.get_backend()
    if world_size == 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(var):
            raise TrainerError(f"{var} is not set (needed with WORLD_SIZE={world_size})")
    try:
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    except dist.DistNetworkError as e:
        if "EADDRINUSE" not in str(e):
            raise
        import sys

        print(f"trainer error (rank {rank}): the rendezvous port {os.environ.get('MASTER_PORT')} is"
              " already taken by another process; exiting so the attempt is relaunched with"
              f" another port (exit {EXIT_RENDEZVOUS_PORT_TAKEN})", file=sys.stderr, flush=True)
        shutdown_and_exit(EXIT_RENDEZVOUS_PORT_TAKEN)
    return device, backend


def init_distributed(env: RunEnv, opts: TrainerOptions) -> Dist:
    """Process group + mesh + checkpoint group for the built-in trainer's options."""
    device, backend = init_process_group(
        env.rank, env.world_size, env.local_rank, opts.dist_timeout_s
    )
    mesh = build_mesh(device.type, env.world_size, opts.parallelism, opts.hsdp_replicate)
    ckpt_group = dist.new_group(backend="gloo")
    return Dist(device, backend, mesh, ckpt_group, env.rank, env.world_size)


def choose_layout(
    world_size: int,
    parallelism: Parallelism | str,
    hsdp_replicate: int = 2,
    local_world_size: int = 0,
) -> tuple[Parallelism, int]:
    """(FSDP or HSDP, replica groups). AUTO = HSDP with one replica per node when the
    job spans nodes (local_world_size < world_size), because FSDP's all-gathers then
    stay on the fast intra-node links and only gradient all-reduces cross nodes."""
    parallelism = Parallelism(parallelism)
    if parallelism is not Parallelism.AUTO:
        return parallelism, hsdp_replicate
    if 0 < local_world_size < world_size and world_size % local_world_size == 0:
        return Parallelism.HSDP, world_size // local_world_size
    return Parallelism.FSDP, 1


def build_mesh(
    device_type: str,
    world_size: int,
    parallelism: Parallelism | str = Parallelism.FSDP,
    hsdp_replicate: int = 2,
    local_world_size: int = 0,
) -> DeviceMesh:
    """1-D FSDP mesh or 2-D HSDP mesh ("replicate", "shard"), see `choose_layout`."""
    parallelism, hsdp_replicate = choose_layout(
        world_size, parallelism, hsdp_replicate, local_world_size
    )
    if parallelism is Parallelism.HSDP:
        rep = hsdp_replicate
        if world_size % rep:
            raise TrainerError(
                f"parallelism=hsdp needs WORLD_SIZE ({world_size}) divisible by "
                f"hsdp_replicate ({rep}); use another hsdp_replicate or fsdp"
            )
        return init_device_mesh(
            device_type, (rep, world_size // rep), mesh_dim_names=("replicate", "shard")
        )
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated layers to shard one by one: the elements of the largest ModuleList
    (`blocks`, GPT-2's `transformer.h`, Llama's `model.layers`), as torchtitan wraps them."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_module(
    model: nn.Module,
    mesh: DeviceMesh,
    device: torch.device,
    *,
    blocks: list[nn.Module] | None = None,
    mixed_precision: str = "none",
    activation_checkpointing: bool = False,
) -> nn.Module:
    """fully_shard each block then the root (FSDP2); optional bf16 and activation
    checkpointing. Blocks default to `find_blocks(model)`."""
    model.to(device)
    blocks = find_blocks(model) if blocks is None else blocks
    if activation_checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        ids = {id(b) for b in blocks}
        apply_activation_checkpointing(model, check_fn=lambda m: id(m) in ids)
        blocks = [m for m in model.modules() if getattr(m, "_checkpoint_wrapped_module", None)
                  is not None and id(m._checkpoint_wrapped_module) in ids] or blocks
    kwargs: dict[str, object] = {"mesh": mesh}
    if mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    elif mixed_precision != "none":
        raise TrainerError(f"mixed_precision={mixed_precision!r}: use 'none' or 'bf16'")
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def shard_model(model: nn.Module, d: Dist, opts: TrainerOptions) -> nn.Module:
    """The built-in trainer's wrapping: its `blocks` with the spec's options."""
    return shard_module(
        model,
        d.mesh,
        d.device,
        blocks=list(model.blocks),  # type: ignore[attr-defined]
        mixed_precision=opts.mixed_precision,
        activation_checkpointing=opts.activation_checkpointing,
    )


def shutdown_and_exit(code: int) -> NoReturn:
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
    record_exit(code)
    os._exit(code)
