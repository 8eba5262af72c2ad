"""The friendly job spec: pydantic :class:`JobSpec` / :class:`TrainerSpec` and their wire form.

ML engineers say "2 nodes x 8 GPUs of the tiny model, spot is fine"; these models hold
sensible defaults and turn into ``computebroker.v1.JobSpec`` (raw protobuf specs and
YAML/JSON mappings, including SkyPilot-style task files, are accepted too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from brokersdk.enums import parse_capacity_type, parse_topology
from brokersdk.errors import InvalidJobSpec
from brokersdk.taskfile import TaskFileError, from_task_file, is_task_file, run_argv
from computebroker.v1 import common_pb2


class TrainerSpec(BaseModel):
    """What our trainer (``python -m trainer``) should do (docs/contracts.md)."""

    model_config = ConfigDict(extra="forbid")

    total_steps: int = 100
    checkpoint_every: int = 10
    global_batch_size: int = 8  # samples per global step, whatever the world size
    seed: int = 0
    model: str = "tiny"
    step_sleep_s: float = 0.0
    options: dict[str, str] = Field(default_factory=dict)

    def to_proto(self) -> common_pb2.TrainerSpec:
        return common_pb2.TrainerSpec(
            total_steps=self.total_steps,
            checkpoint_every=self.checkpoint_every,
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            model=self.model,
            step_sleep_s=self.step_sleep_s,
            options={k: str(v) for k, v in self.options.items()},
        )


class JobSpec(BaseModel):
    """A friendly job spec. Defaults: 1 node x 1 GPU, priority "training", tiny model.

    Semantic checks (GPU counts, teams, URIs) are the broker's job: it is the one
    place that validates every input, so the SDK and CLI report its messages.
    Topology levels, capacity types and regions are given by name, e.g.
    ``topology_required="ultraserver"``, ``capacity_types=["spot", "on-demand"]``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    team: str = "default"
    priority_class: str = "training"
    nodes: int = 1
    gpus_per_node: int = 1
    accelerator: str = ""
    topology_required: str = ""
    topology_preferred: str = ""
    allowed_regions: list[str] = Field(default_factory=list)
    denied_regions: list[str] = Field(default_factory=list)
    preferred_regions: list[str] = Field(default_factory=list)
    dataset_uri: str = ""
    dataset_region: str = ""
    checkpoint_uri: str = ""
    # Start from another job's checkpoint (its id, or a step directory); that job must
    # have shared its checkpoints with this team (BrokerClient.share_checkpoints).
    resume_from: str = ""
    spot_ok: bool = False
    capacity_types: list[str] = Field(default_factory=list)
    max_price_per_gpu_hour: float = 0.0
    min_nodes: int = 0
    max_nodes: int = 0
    expected_duration_s: float = 0.0
    # Node losses the job may survive within node_failure_window_s seconds (0 = its whole
    # life); they never spend the broker's max_restarts. Unset = the broker's settings.
    max_node_failures: int | None = Field(None, ge=0, le=10_000, strict=True)
    # The window of max_node_failures in seconds (0 = the job's whole life).
    node_failure_window_s: float | None = Field(None, ge=0, le=366 * 86_400.0, allow_inf_nan=False)
    # Your program: ``run`` (argv list, or a command line split with shlex, or a
    # multi-line script for ``bash -c``); ``command`` is its older name (same field).
    run: list[str] | str = Field(default_factory=list)
    command: list[str] = Field(default_factory=list)
    # A local directory to package and upload (``submit`` does it), or an uploaded
    # workdir's digest ("sha256:..."); the ranks run in its unpacked copy.
    workdir: str = ""
    image: str = ""  # container image (Kubernetes executor only)
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)

    def argv(self) -> list[str]:
        """The program to run (empty = the built-in trainer)."""
        try:
            run = run_argv(self.run)
        except TaskFileError as e:
            raise InvalidJobSpec(str(e)) from None
        if run and self.command and run != list(self.command):
            raise InvalidJobSpec("give run or command (its older name), not both")
        return run or list(self.command)

    def to_proto(self, workdir: common_pb2.WorkdirRef | None = None) -> common_pb2.JobSpec:
        """The wire spec. ``spot_ok`` means: any capacity type, spot included.

        ``workdir``: the uploaded ref; needed when ``self.workdir`` is a local path
        (``BrokerClient.submit`` uploads and passes it)."""
        if workdir is None and self.workdir:
            if not self.workdir.startswith("sha256:"):
                raise InvalidJobSpec(
                    f"workdir {self.workdir!r} is a local path: submit it with BrokerClient.submit,"
                    " which uploads it")
            workdir = common_pb2.WorkdirRef(digest=self.workdir)
        ctypes = [parse_capacity_type(c) for c in self.capacity_types]
        if self.spot_ok and not ctypes:
            ctypes = [
                common_pb2.CAPACITY_TYPE_ON_DEMAND,
                common_pb2.CAPACITY_TYPE_SPOT,
                common_pb2.CAPACITY_TYPE_TRAINING_PLAN,
                common_pb2.CAPACITY_TYPE_RESERVED,
            ]
        elif self.spot_ok and common_pb2.CAPACITY_TYPE_SPOT not in ctypes:
            ctypes.append(common_pb2.CAPACITY_TYPE_SPOT)
        return common_pb2.JobSpec(
            name=self.name,
            team=self.team,
            priority_class=self.priority_class,
            command=self.argv(),
            image=self.image,
            workdir=workdir,
            resources=common_pb2.Resources(
                nodes=self.nodes, gpus_per_node=self.gpus_per_node, accelerator=self.accelerator
            ),
            topology=common_pb2.TopologyConstraint(
                required=parse_topology(self.topology_required) if self.topology_required else 0,
                preferred=parse_topology(self.topology_preferred)
                if self.topology_preferred
                else 0,
            ),
            allowed_regions=list(self.allowed_regions),
            denied_regions=list(self.denied_regions),
            preferred_regions=list(self.preferred_regions),
            dataset_uri=self.dataset_uri,
            dataset_region=self.dataset_region,
            checkpoint_uri=self.checkpoint_uri,
            resume_from=self.resume_from,
            capacity_types=ctypes,
            max_price_per_gpu_hour=self.max_price_per_gpu_hour,
            elasticity=common_pb2.Elasticity(min_nodes=self.min_nodes, max_nodes=self.max_nodes),
            expected_duration_s=self.expected_duration_s,
            max_node_failures=self.max_node_failures,
            node_failure_window_s=self.node_failure_window_s,
            env={k: str(v) for k, v in self.env.items()},
            trainer=self.trainer.to_proto(),
            labels={k: str(v) for k, v in self.labels.items()},
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec | common_pb2.JobSpec:
        """Build a spec from a YAML/JSON mapping.

        Two forms are accepted: this class's flat fields (``nodes``, ``gpus_per_node``,
        ...), or the API's own JSON form (``resources: {nodes: ...}``), which is
        returned as a protobuf. Errors become :class:`InvalidJobSpec`.
        """
        if not isinstance(data, Mapping):
            raise InvalidJobSpec("a job spec must be a mapping of fields")
        data = dict(data)
        if "spec" in data and isinstance(data["spec"], Mapping) and len(data) == 1:
            data = dict(data["spec"])
        if is_task_file(data):  # SkyPilot-style: resources.accelerators, num_nodes, run, envs
            try:
                data = from_task_file(data)
            except TaskFileError as e:
                raise InvalidJobSpec(f"bad task file: {e}") from None
        if "resources" in data or "topology" in data or "elasticity" in data:
            try:
                return json_format.ParseDict(data, common_pb2.JobSpec())
            except json_format.ParseError as e:
                raise InvalidJobSpec(f"bad job spec: {e}") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise InvalidJobSpec(f"bad job spec: {_pydantic_message(e)}") from None


def _pydantic_message(err: ValidationError) -> str:
    """pydantic's errors on one line; an unknown key gets a did-you-mean from the fields
    of the model it was found in (``stpes`` -> ``steps``? no: ``total_steps``)."""
    parts = []
    for item in err.errors():
        path = tuple(item.get("loc", ()))
        loc = ".".join(str(p) for p in path)
        msg = item.get("msg", "invalid")
        if item.get("type") == "extra_forbidden" and path:
            near = _near_field(str(path[-1]), TrainerSpec if path[:1] == ("trainer",) else JobSpec)
            msg = "unknown field" + (f" (did you mean {near!r}?)" if near else "")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def _near_field(key: str, model: type[BaseModel]) -> str:
    import difflib

    fields = list(model.model_fields)
    near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
    if not near:  # "steps" for total_steps: a field that ends or starts with the key
        near = [f for f in fields if len(key) >= 4 and (f.endswith(key) or f.startswith(key))]
    return near[0] if near else ""


def spec_to_proto(spec: JobSpec | common_pb2.JobSpec | Mapping[str, Any]) -> common_pb2.JobSpec:
    if isinstance(spec, common_pb2.JobSpec):
        return spec
    if isinstance(spec, JobSpec):
        return spec.to_proto()
    if isinstance(spec, Mapping):
        built = JobSpec.from_dict(spec)
        return built if isinstance(built, common_pb2.JobSpec) else built.to_proto()
    raise TypeError(f"spec must be a JobSpec, a computebroker.v1.JobSpec or a dict, not {spec!r}")
