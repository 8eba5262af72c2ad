"""Fast in-process checks of the trainer's pure parts: config parsing, data order, store."""

from __future__ import annotations

import json

import pytest

from trainer.config import load_run_env, parse_spec
from trainer.data import GlobalOrder, SyntheticTokens, micro_batches, rank_slice
from trainer.errors import TrainerError
from trainer.storage import LocalStore, split_checkpoint_uri, step_name


def test_spec_accepts_proto_json_shapes() -> None:
    # protobuf's JSON mapping: camelCase names, int64 as strings, options all strings
    spec = parse_spec(
        json.dumps(
            {
                "totalSteps": "40",
                "globalBatchSize": 16,
                "model": "tiny",
                "options": {"keep_last": "5", "async_checkpoint": "false", "parallelism": "hsdp"},
            }
        )
    )
    assert spec.total_steps == 40 and spec.global_batch_size == 16
    assert spec.options.keep_last == 5 and spec.options.async_checkpoint is False
    assert spec.options.parallelism == "hsdp"


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("", "empty"),
        ("{not json", "not valid JSON"),
        ('{"total_steps": 5, "global_batch_size": 4, "model": "huge"}', "unknown model preset"),
        ('{"total_steps": 5, "global_batch_size": 4, "options": {"keep_lats": "2"}}', "keep_lats"),
        ('{"total_steps": 0, "global_batch_size": 4}', "total_steps"),
    ],
)
def test_bad_spec_is_one_clear_error(raw: str, needle: str) -> None:
    with pytest.raises(TrainerError, match=needle):
        parse_spec(raw)


def test_run_env_requires_checkpoint_uri() -> None:
    with pytest.raises(TrainerError, match="CB_CHECKPOINT_URI"):
        load_run_env({"RANK": "0", "WORLD_SIZE": "1"})
    env = load_run_env({"RANK": "1", "WORLD_SIZE": "2", "CB_CHECKPOINT_URI": "/x", "CB_ATTEMPT": "3"})
    assert (env.rank, env.world_size, env.attempt, env.grace_s) == (1, 2, 3, 120.0)


def test_global_order_is_world_size_independent() -> None:
    order = GlobalOrder(seed=3, dataset_size=50, global_batch_size=16)
    ids = [order.step_ids(s) for s in range(8)]  # crosses two epoch boundaries
    stream = [i for step in ids for i in step]
    assert sorted(stream[:50]) == list(range(50))  # each epoch is a permutation
    assert stream[:50] != stream[50:100]  # and epochs differ
    for world in (1, 2, 3, 4, 5):
        for step in ids:
            slices = [rank_slice(step, r, world) for r in range(world)]
            assert [i for s in slices for i in s] == step
    assert GlobalOrder(3, 50, 16).ids_at(32, 16) == ids[2]


def test_samples_are_pure_functions_of_seed_and_id() -> None:
    a, b = SyntheticTokens(1, 64, 16), SyntheticTokens(1, 64, 16)
    assert a.sample(12345).tolist() == b.sample(12345).tolist()
    assert a.sample(1).tolist() != SyntheticTokens(2, 64, 16).sample(1).tolist()
    assert micro_batches([1, 2, 3], 2, 3) == [[1, 2], [3], []]


def test_local_store_lists_only_manifested_checkpoints(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    for step, complete in ((10, True), (20, False)):
        d = tmp_path / step_name(step)
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
        if complete:
            store.write_manifest(step_name(step), {"step": step})
    assert store.list_steps() == {10: True, 20: False}
    assert split_checkpoint_uri("s3://b/p/step-000000020/") == ("s3://b/p", "step-000000020")
    with pytest.raises(TrainerError):
        split_checkpoint_uri("s3://b/p/latest")
