"""The trainer option `memory_keep`: how many steps each of a job's memory keepers holds
per rank. Why it exists: a large model's keepers otherwise hold two snapshots of every
rank they serve (the 200m model: 6 GB per node's keeper at one rank per node), which is
what kept that model's benchmark from fitting this machine. Real keeper processes here
(the local executor's pool); the Kubernetes keeper's manifest is checked as data."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from checkpoint_layout import job_options
from region_agents.executors.k8s_keepers import keeper_job, keeper_resources
from region_agents.executors.memory_keepers import KeeperPool, memory_keep
from trainer.config import TrainerOptions
from trainer.memkeeper import KEEP, TOKEN_ENV
from trainer.memtier import KEEPERS_ENV, KeeperClient


def test_the_option_defaults_to_the_keepers_bound_and_a_bad_value_keeps_it(
        caplog: pytest.LogCaptureFixture) -> None:
    assert memory_keep({}) == KEEP == 2
    assert memory_keep({"memory_keep": "1"}) == 1
    assert memory_keep({"memory_keep": "3"}) == 3
    with caplog.at_level(logging.WARNING):
        assert memory_keep({"memory_keep": "0"}) == KEEP
        assert memory_keep({"memory_keep": "one"}) == KEEP
    assert sum("memory_keep" in r.getMessage() for r in caplog.records) == 2


def test_submit_refuses_a_bad_value_and_the_trainer_accepts_the_option() -> None:
    with pytest.raises(job_options.OptionError, match="memory_keep"):
        job_options.parse({"memory_keep": "0"})
    assert job_options.parse({"memory_keep": "1"})["memory_keep"] == 1
    TrainerOptions.model_validate({"memory_keep": "1"})  # an executors' option: accepted


def _put(client: KeeperClient, step: int) -> None:
    reply, _ = client.request({"op": "put", "job": "j", "rank": 0, "step": step, "world": 1},
                              b"x" * 1000)
    assert reply["ok"], reply


@pytest.mark.parametrize("keep, held", [(1, [3]), (None, [2, 3])])
def test_local_keepers_hold_the_jobs_number_of_steps(tmp_path: Path, keep: int | None,
                                                    held: list[int]) -> None:
    pool = KeeperPool(tmp_path)
    try:
        env = pool.env_for("j", ["n0"], every=1, keep=keep)
        client = KeeperClient(env[KEEPERS_ENV], env[TOKEN_ENV])
        for step in (1, 2, 3):
            _put(client, step)
        reply, _ = client.request({"op": "steps", "job": "j", "rank": 0})
        assert reply["steps"] == held
    finally:
        pool.shutdown()


def test_a_kubernetes_keeper_is_told_its_steps_and_asks_for_their_memory() -> None:
    snap = 100 * 2**20
    job = keeper_job("j", "n0", namespace="t", keep=1,
                     resources=keeper_resources(snap, 1, keep=1))
    command = job.spec.template.spec.containers[0].command
    assert command[command.index("--keep") + 1] == "1"
    default = keeper_job("j", "n0", namespace="t").spec.template.spec.containers[0].command
    assert default[default.index("--keep") + 1] == str(KEEP)
    one = keeper_resources(snap, 1, keep=1).requests["memory"]
    two = keeper_resources(snap, 1, keep=2).requests["memory"]
    assert int(one.removesuffix("Mi")) < int(two.removesuffix("Mi"))
