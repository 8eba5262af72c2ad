"""The library's pure parts, in process: the sampler, the model fingerprint, step-0 refusal."""

from __future__ import annotations

import pytest
import torch

import trainer as cb
from tests.trainer.managers import make_manager
from trainer.checkpointer import model_fingerprint


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_sampler_covers_the_global_batch_in_order_on_any_world_size(world: int) -> None:
    """Concatenating every rank's micro-batches gives the same global ids whatever the
    world size, every rank has the same number of micro-batches, and scale sums to 1
    per sample over the global batch."""
    ref = cb.ResumableSampler(100, global_batch=12, seed=3)
    samplers = [
        cb.ResumableSampler(100, global_batch=12, seed=3, micro_batch=2, rank=r, world_size=world)
        for r in range(world)
    ]
    for _ in range(20):  # crosses epoch boundaries (100 samples, 12 per step)
        want = ref.next().ids
        batches = [s.next() for s in samplers]
        assert len({len(b.micro) for b in batches}) == 1
        got = [i for b in batches for mb in b.micro for i in mb]
        assert got == want
        assert all(b.ids == want and b.scale == world / 12 for b in batches)
    assert ref.samples_seen == 240 and ref.step == 20


def test_sampler_resumes_exactly_and_refuses_another_order() -> None:
    a = cb.ResumableSampler(50, global_batch=8, seed=1)
    for _ in range(7):
        a.next()
    b = cb.ResumableSampler(50, global_batch=8, seed=1, rank=1, world_size=2)
    b.load_state_dict(a.state_dict())
    assert b.peek().ids == a.peek().ids and b.samples_seen == 56
    other = cb.ResumableSampler(50, global_batch=16, seed=1)
    with pytest.raises(cb.TrainerError, match="global_batch=8"):
        other.load_state_dict(a.state_dict())


def test_model_fingerprint_ignores_wrappers_but_not_shapes() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    def net(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(4, width), torch.nn.ModuleList([torch.nn.Linear(width, width)])
        )

    plain, wrapped = net(8), net(8)
    apply_activation_checkpointing(wrapped, check_fn=lambda m: isinstance(m, torch.nn.Linear))
    assert model_fingerprint(plain) == model_fingerprint(wrapped)
    assert model_fingerprint(plain) != model_fingerprint(net(16))


def test_step_0_is_never_checkpointed(tmp_path) -> None:
    """Issue 15 defect 5: before the first optimizer step there is no training state."""
    m = make_manager(str(tmp_path))
    with pytest.raises(ValueError, match="no optimizer step"):
        m.save(0, 0, blocking=True)
    assert not list(tmp_path.iterdir())


def test_public_names_resolve() -> None:
    for name in cb.__all__:
        assert getattr(cb, name) is not None
    assert (cb.EXIT_OK, cb.EXIT_BAD_CONFIG, cb.EXIT_CHECKPOINTED) == (0, 2, 75)
    with pytest.raises(AttributeError):
        _ = cb.no_such_name


def test_auto_layout_is_hsdp_across_nodes_and_fsdp_within_one() -> None:
    from trainer.parallel import Parallelism, choose_layout

    assert choose_layout(8, "auto", local_world_size=4) == (Parallelism.HSDP, 2)
    assert choose_layout(4, "auto", local_world_size=4) == (Parallelism.FSDP, 1)
    assert choose_layout(3, "auto", local_world_size=2) == (Parallelism.FSDP, 1)  # uneven
    assert choose_layout(4, "auto") == (Parallelism.FSDP, 1)  # no LOCAL_WORLD_SIZE
    assert choose_layout(4, "hsdp", 2, local_world_size=4) == (Parallelism.HSDP, 2)
