"""A restore from the memory tier gives a never-stepped optimizer its state from the
snapshot's head (trainer/memtier.py `seed_optimizer_state`) instead of the zero-lr step
`get_state_dict` runs to make it: the state has every entry the snapshot lists, with its
dtype and shape, `get_state_dict` then hands out those very tensors (no step ran: the
parameters are untouched), and anything it cannot derive safely leaves the optimizer as
it was, for the old way. Unit test, no processes.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict

from trainer.memtier import seed_optimizer_state


def model_and_optim() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def snapshot_of(model: torch.nn.Module, step_in_head: bool = False
                ) -> tuple[dict[str, tuple[str, list[int], bool]], dict]:
    """What a snapshot's head lists: AdamW's moments and its scalar ``step`` tensors
    among the tensors (as a snapshot holds them), or ``step`` among the small items."""
    stored, small = {}, {}
    for fqn, p in model.named_parameters():
        for name in ("exp_avg", "exp_avg_sq"):
            stored[f"optim.state.{fqn}.{name}"] = ("float32", list(p.shape), False)
        if step_in_head:
            small[f"optim.state.{fqn}.step"] = torch.tensor(7.0)
        else:
            stored[f"optim.state.{fqn}.step"] = ("float32", [], False)
    stored["model.0.weight"] = ("float32", [3, 4], False)  # not optimizer state: ignored
    small["optim.param_groups.lr"] = 0.1
    return stored, small


def test_a_fresh_optimizer_gets_the_snapshots_state_without_a_step() -> None:
    model, opt = model_and_optim()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stored, small = snapshot_of(model)
    assert seed_optimizer_state(opt, model, stored, small)
    for fqn, p in model.named_parameters():
        st = opt.state[p]
        assert set(st) == {"exp_avg", "exp_avg_sq", "step"}, fqn
        assert st["exp_avg"].shape == p.shape and st["exp_avg"].dtype == torch.float32
        assert not st["exp_avg"].requires_grad and st["step"].shape == ()
        st["step"].fill_(7.0)  # what the restore reads into it
    seeded = {id(t) for st in opt.state.values() for t in st.values()}
    _, osd = get_state_dict(model, opt)  # no zero-lr step: the seeded tensors come back
    assert {id(t) for st in osd["state"].values() for t in st.values()} == seeded
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    for st in opt.state.values():  # what a restore then writes into them
        st["exp_avg"].zero_()
        st["exp_avg_sq"].fill_(1.0)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()  # and training goes on from there
    assert all(float(st["step"]) == 8.0 for st in opt.state.values())


def test_what_cannot_be_derived_leaves_the_optimizer_fresh() -> None:
    model, opt = model_and_optim()
    stored, small = snapshot_of(model, step_in_head=True)
    assert seed_optimizer_state(opt, model, stored, small)  # small items are taken as saved
    assert all(float(st["step"]) == 7.0 for st in opt.state.values())
    opt.state.clear()
    key = next(iter(stored))
    factored = {**stored, key: ("float32", [3], False)}  # e.g. Adafactor's row factors
    assert not seed_optimizer_state(opt, model, factored, small)
    partial = {k: v for k, v in stored.items() if not k.startswith("optim.state.1.")}
    small_partial = {k: v for k, v in small.items() if not k.startswith("optim.state.1.")}
    assert not seed_optimizer_state(opt, model, partial, small_partial)  # a param without state
    renamed = {k.replace("optim.state.0.", "optim.state.x."): v for k, v in stored.items()}
    assert not seed_optimizer_state(opt, model, renamed, small)  # no such parameter
    sharded = {k: (d, shape, True) for k, (d, shape, _) in stored.items()}
    assert not seed_optimizer_state(opt, model, sharded, small)  # DTensor state, plain params
    assert not opt.state
    assert seed_optimizer_state(opt, model, stored, small)
    assert not seed_optimizer_state(opt, model, stored, small)  # it has state already
