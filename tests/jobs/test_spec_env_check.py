"""SubmitJob's env check (broker/api/validation.py): one pass over the joined keys and
values for a spec that is fine, the same refusal as the per-variable check otherwise."""

from __future__ import annotations

import pytest

from broker.api.errors import InvalidArgument
from broker.api.validation import _env_ok, validate_spec
from computebroker.v1 import common_pb2 as pb


def _spec(env: dict[str, str]) -> pb.JobSpec:
    s = pb.JobSpec(name="n", team="ml", command=["true"])
    s.resources.nodes, s.resources.gpus_per_node = 1, 1
    s.env.update(env)
    return s


@pytest.mark.parametrize("env", [{}, {"A": "1"}, {f"V_{i}": "x" * 40 for i in range(40)},
                                 {"XCB_": "1", "_": ""}])
def test_good_envs_pass_at_once(env: dict[str, str]) -> None:
    assert _env_ok(env)
    validate_spec(_spec(env), {"": 0})


@pytest.mark.parametrize(("env", "words"), [
    ({"A": "1", "1A": "x"}, "'1A' is not a valid environment variable name"),
    ({"A\nB": "x"}, "is not a valid environment variable name"),
    ({"A-B": "x"}, "is not a valid environment variable name"),
    ({"": "x"}, "'' is not a valid environment variable name"),
    ({"CB_JOB": "1"}, "'CB_JOB': CB_* variables are set by the broker"),
    ({"A": "1", "CB_X": "1"}, "'CB_X': CB_* variables"),
    ({"A": "a\x00b"}, "spec.env['A'] contains a NUL character"),
])
def test_bad_envs_are_named(env: dict[str, str], words: str) -> None:
    assert not _env_ok(env)
    with pytest.raises(InvalidArgument) as e:
        validate_spec(_spec(env), {"": 0})
    assert words in e.value.message
