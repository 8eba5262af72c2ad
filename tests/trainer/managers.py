"""In-process CheckpointManagers over a plain module, for the trainer's unit tests.

No process group: DCP's single-process mode. The model has one optimizer step taken,
so AdamW's moments exist and a checkpoint holds what a real one holds.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.checkpoint import CheckpointManager
from trainer.storage import Store, open_store


def make_manager(
    root: str,
    width: int = 64,
    seed: int = 0,
    threads: int = 2,
    use_async: bool = False,
    store: Store | None = None,
) -> CheckpointManager:
    """Linear(width, width) -> Linear(width, 4), weights and first step from `seed`."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4))
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    optim.step()
    return CheckpointManager(
        store or open_store(root),
        model=model,
        optim=optim,
        sched=LambdaLR(optim, lambda s: 1.0),
        ckpt_group=None,
        rank=0,
        world_size=1,
        manifest_base={"model": {"preset": "unit", "width": width}},
        keep_last=5,
        threads=threads,
        use_async=use_async,
    )


def assert_same_state(a: CheckpointManager, b: CheckpointManager) -> None:
    """Model weights and every AdamW moment and step count are equal."""
    for (name, pa), (_, pb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(pa, pb), name
    sa, sb = a.optim.state_dict()["state"], b.optim.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for k in sa:
        for field in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(sa[k][field], sb[k][field]), (k, field)
