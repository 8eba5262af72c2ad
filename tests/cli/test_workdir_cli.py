"""Packaging a workdir (determinism, ignore rules, size limit), `run` strings, SkyPilot-
style task files, and `brokerctl submit --workdir/-f` against a real broker."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from brokerctl.main import main
from brokersdk.client import BrokerClient, InvalidJobSpec, JobSpec
from brokersdk.taskfile import TaskFileError, from_task_file, is_task_file, run_argv
from brokersdk.workdir import WorkdirError, pack
from tests.cli.conftest import TEAM


def make_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('train')\n")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "run.sh", 0o755)
    for junk in (".git", "__pycache__", ".venv", "data", "pkg/__pycache__"):
        (root / junk).mkdir(parents=True, exist_ok=True)
        (root / junk / "blob").write_text("junk")
    (root / "ckpt.pt").write_text("weights")
    (root / "keep.pt").write_text("kept")
    (root / ".brokerignore").write_text("# big things\n*.pt\n!keep.pt\ndata/\n")
    return root


def test_pack_is_deterministic_and_honours_ignores(tmp_path: Path) -> None:
    a = make_tree(tmp_path / "a")
    b = make_tree(tmp_path / "b")
    os.utime(b / "train.py", (1_000_000, 1_000_000))  # other mtimes, same content
    pa, pb_ = pack(a), pack(b)
    assert pa.digest == pb_.digest and pa.size_bytes == pb_.size_bytes
    tar_path = tmp_path / "a.tar"
    pa.write_to(tar_path)
    data = tar_path.read_bytes()
    assert len(data) == pa.size_bytes and "sha256:" + hashlib.sha256(data).hexdigest() == pa.digest
    # Small chunks give the same bytes.
    assert b"".join(pa.chunks(1000)) == data
    with tarfile.open(tar_path) as t:
        infos = {i.name: i for i in t.getmembers()}
    assert sorted(infos) == ["keep.pt", "pkg/model.py", "run.sh", "train.py"]
    assert infos["run.sh"].mode == 0o755 and infos["train.py"].mode == 0o644
    assert {i.mtime for i in infos.values()} == {0} and {i.uid for i in infos.values()} == {0}
    (b / "train.py").write_text("print('changed')\n")
    assert pack(b).digest != pa.digest


def test_pack_refuses_over_limit(tmp_path: Path) -> None:
    d = make_tree(tmp_path / "a")
    (d / "huge.bin").write_bytes(b"\0" * 200_000)
    with pytest.raises(WorkdirError, match=r"over the 0.1 MiB limit.*huge\.bin"):
        pack(d, max_bytes=100_000)
    with pytest.raises(WorkdirError, match="not a directory"):
        pack(tmp_path / "missing")


def test_run_argv_forms() -> None:
    assert run_argv("python train.py --lr 3e-4 --name 'a b'") == [
        "python", "train.py", "--lr", "3e-4", "--name", "a b"]
    assert run_argv(["python", "x y"]) == ["python", "x y"]
    assert run_argv("echo 1\necho 2\n") == ["bash", "-c", "echo 1\necho 2"]
    with pytest.raises(TaskFileError, match="not a valid command line"):
        run_argv("python 'unclosed")
    with pytest.raises(InvalidJobSpec):
        JobSpec.from_dict({"run": ["python", 3]})  # non-string items
    with pytest.raises(InvalidJobSpec, match="not both"):
        JobSpec(run="a", command=["b"]).to_proto()


def test_task_file_conversion() -> None:
    task = yaml.safe_load("""
name: gpt
resources:
  accelerators: H100:8
  use_spot: true
num_nodes: 2
workdir: .
envs: {LR: "3e-4"}
run: |
  echo rank $RANK
  python train.py --lr $LR
team: ml
priority: fine-tuning
min_nodes: 1
max_nodes: 2
checkpoint_uri: s3://ckpt/gpt
""")
    assert is_task_file(task)
    flat = from_task_file(task)
    spec = JobSpec.model_validate({**flat, "workdir": "sha256:" + "a" * 64}).to_proto()
    assert spec.resources.nodes == 2 and spec.resources.gpus_per_node == 8
    assert spec.resources.accelerator == "h100" and spec.priority_class == "fine-tuning"
    assert spec.env["LR"] == "3e-4" and spec.command[:2] == ["bash", "-c"]
    assert spec.elasticity.min_nodes == 1 and spec.checkpoint_uri == "s3://ckpt/gpt"
    assert 2 in spec.capacity_types  # spot allowed
    assert not is_task_file({"nodes": 1, "command": ["x"]})  # the flat form stays flat
    assert not is_task_file({"resources": {"nodes": 1, "gpusPerNode": 1}})  # API JSON form
    with pytest.raises(TaskFileError, match="cloud"):
        from_task_file({"run": "x", "resources": {"cloud": "aws"}})


def test_cli_submit_workdir_and_task_file(capsys, broker_address: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    code = make_tree(tmp_path / "code")
    monkeypatch.chdir(code)
    rc = main(["--broker", broker_address, "submit", "--name", "mine", "--team", TEAM,
               "--workdir", ".", "--", "python", "train.py", "--lr", "3e-4"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    job_id = out.split("submitted job ")[1].split()[0]
    with BrokerClient(broker_address) as c:
        job = c.get_job(job_id)
        assert list(job.spec.command) == ["python", "train.py", "--lr", "3e-4"]
        assert c.has_workdir(job.spec.workdir.digest).exists
    rc = main(["--broker", broker_address, "job", job_id])
    out, _ = capsys.readouterr()
    assert rc == 0 and "restarts from the beginning" in out and "python train.py" in out

    # One quoted command line is split like a shell would; the same code is not re-sent.
    rc = main(["--broker", broker_address, "submit", "--name", "one-string", "--team", TEAM,
               "--workdir", ".", "-o", "json", "--", "python train.py --name 'a b'"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert '"python",' in out and '"a b"' in out and job.spec.workdir.digest in out

    (code / "job.yaml").write_text(
        f"name: from-yaml\nteam: {TEAM}\nresources: {{accelerators: 'sim:1'}}\n"
        "workdir: .\nenvs: {A: '1'}\nrun: python train.py\n")
    rc = main(["--broker", broker_address, "submit", "-f", "job.yaml", "-o", "json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert '"from-yaml"' in out and '"sha256:' in out

    (code / "bad.yaml").write_text("name: x\nrun: python t.py\nresources: {cloud: aws}\n")
    rc = main(["--broker", broker_address, "submit", "-f", "bad.yaml"])
    _, err = capsys.readouterr()
    assert rc == 2 and "cloud" in err and "Traceback" not in err
    rc = main(["--broker", broker_address, "submit", "--team", TEAM, "--name", "x",
               "--workdir", str(tmp_path / "nope"), "--", "python", "t.py"])
    _, err = capsys.readouterr()
    assert rc == 2 and "not a directory" in err


def test_example_task_file_parses() -> None:
    root = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((root / "examples" / "task.yaml").read_text())
    flat = from_task_file(data)
    assert (root / flat["workdir"]).is_dir()
    spec = JobSpec.model_validate({**flat, "workdir": "sha256:" + "b" * 64}).to_proto()
    assert spec.resources.accelerator == "h100" and spec.command[:2] == ["bash", "-c"]
    assert "python hello.py" in spec.command[2] and spec.env["LR"] == "3e-4"
