"""Fast in-process checks of the trainer's pure parts: config parsing, data order, store."""

from __future__ import annotations

import json

import pytest

from tests.trainer.managers import make_manager
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


# ---------------------------------------------------------------- checksums and deadlines
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_manifest_digest_matches_bytes_and_load_verifies_it(tmp_path) -> None:
    import xxhash

    m = make_manager(str(tmp_path), width=32, use_async=True)
    m.warm_staging()
    m.save(1, 8)  # async: digests come from the writer threads and the coordinator's finish
    m.wait()
    m.save(2, 16, blocking=True)
    for step in (1, 2):
        d = tmp_path / step_name(step)
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["manifest_version"] == 3
        names = {f["name"] for f in manifest["files"]}
        assert ".metadata" in names and "__0_0.distcp" in names
        for f in manifest["files"]:
            data = (d / f["name"]).read_bytes()
            assert f["size"] == len(data)
            assert f["xxh3_128"] == xxhash.xxh3_128(data).hexdigest()
    assert make_manager(str(tmp_path), width=32).load(step_name(2))["step"] == 2
    # same size, one flipped byte: only the digest can tell
    shard = tmp_path / step_name(2) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(TrainerError, match=r"is corrupt: file __0_0.distcp has xxh3_128 .* manifest says"):
        make_manager(str(tmp_path), width=32).load(step_name(2))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_save_past_its_deadline_raises_and_commits_nothing(tmp_path) -> None:
    import threading
    import time

    from trainer.checkpoint import GraceExceeded
    from trainer.storage import LocalStore, LocalWriter

    release = threading.Event()

    class StuckWriter(LocalWriter):
        def write_data(self, plan, planner):  # noqa: ANN001, ANN202 - a store that hangs
            release.wait(60)
            return super().write_data(plan, planner)

    class StuckStore(LocalStore):
        def writer(self, name: str, threads: int) -> LocalWriter:
            return StuckWriter(self.uri(name), threads)

    m = make_manager(str(tmp_path), width=32)
    m.save(1, 8, blocking=True)
    stuck = make_manager(str(tmp_path), width=32, store=StuckStore(str(tmp_path)))
    stuck.last_durable_step = 1
    with pytest.raises(GraceExceeded):
        stuck.save(2, 16, blocking=True, deadline=time.monotonic() + 0.2)
    assert LocalStore(str(tmp_path)).list_steps().get(2) is not True  # step 1 stays the latest
    assert LocalStore(str(tmp_path)).list_steps()[1] is True
    release.set()


def test_resume_point_missing_is_retryable_not_a_config_error(tmp_path) -> None:
    """find_resume_point: a pruned or incomplete CB_RESUME_FROM raises ResumeUnavailable
    (exit 77), a malformed one stays a TrainerError (exit 2); no CB_RESUME_FROM = latest."""
    from trainer.checkpoint import find_resume_point
    from trainer.errors import ResumeUnavailable

    root = tmp_path / "attempt-1"
    (root / step_name(12)).mkdir(parents=True)  # incomplete
    (root / step_name(14)).mkdir()
    (root / step_name(14) / "manifest.json").write_text('{"step": 14, "files": []}')
    store = LocalStore(str(root))
    for missing in (root / step_name(10), root / step_name(12)):
        with pytest.raises(ResumeUnavailable, match="is not a complete checkpoint"):
            find_resume_point(store, str(missing), 1)
    with pytest.raises(TrainerError, match="does not name a checkpoint directory"):
        find_resume_point(store, str(root / "latest"), 1)
    src, name = find_resume_point(store, str(root / step_name(14)), 1)
    assert name == step_name(14)
    assert find_resume_point(store, "", 1)[1] == step_name(14)
    assert not issubclass(ResumeUnavailable, TrainerError)


def test_checkpoint_pruned_while_loading_is_retryable(tmp_path) -> None:
    """Manifest or a listed file gone by load time (the writer pruned it): ResumeUnavailable
    (exit 77). A file that is there with the wrong size or digest stays corrupt (exit 2,
    tests above)."""
    from trainer.errors import ResumeUnavailable

    m = make_manager(str(tmp_path), width=32)
    m.save(3, 24, blocking=True)
    m.save(4, 32, blocking=True)
    (tmp_path / step_name(3) / "__0_0.distcp").unlink()
    with pytest.raises(ResumeUnavailable, match=r"lost file __0_0.distcp"):
        make_manager(str(tmp_path), width=32).load(step_name(3))
    (tmp_path / step_name(4) / "manifest.json").unlink()
    with pytest.raises(ResumeUnavailable, match="disappeared before it could be loaded"):
        make_manager(str(tmp_path), width=32).load(step_name(4))


def test_a_save_made_again_after_its_manifest_was_written_commits_again(tmp_path) -> None:
    """A save tried again once its manifest is already in the store (the ranks agreed it
    failed on an outage, but rank 0's manifest had been written) finds manifest.json
    among the step's files. It
    was taken for a foreign file ("no digest for files ['manifest.json']"): the attempt
    exited 79 (a storage failure, a restart) in the store-outage campaign. A manifest
    never lists itself: the commit is simply made again."""
    m = make_manager(str(tmp_path), width=32)
    m.save(1, 8, blocking=True)
    m.save(2, 16, blocking=True)
    # The ranks agreed the save failed (another rank saw the outage; or rank 0's answer
    # was lost): trainer/checkpointer.py's _abandon forgets it, and step 2 is saved again.
    m.last_durable_step = m.last_saved_step = 1
    m.save(2, 16, blocking=True)
    manifest = json.loads((tmp_path / step_name(2) / "manifest.json").read_text())
    assert "manifest.json" not in {f["name"] for f in manifest["files"]}
    assert make_manager(str(tmp_path), width=32).load(step_name(2))["step"] == 2
