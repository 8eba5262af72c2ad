"""A new user's path, end to end, with real processes and the docs' own commands.

From a fresh directory (the user's "home"), run the by-hand walkthrough's `brokerctl serve` and
`brokerctl agent ... --work-dir var/agents/us-east-2` (relative paths, and the example
inventory's relative checkpoint bucket), then:

1. submit a small script of one's own with `brokerctl submit --workdir code -- python
   hello.py ...`: it runs in its unpacked workdir with the documented environment and
   its output file appears there;
2. submit a built-in trainer job: its checkpoints must land in the store the inventory
   names (relative to where the agent was started), not inside the rank's own cwd
   (the bug of issue 11: progress and checkpoints silently went to the wrong place);
3. the "Bring your own training code" submit line, word for word, with the library
   example as the project's train.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from brokersdk.client import BrokerClient
from computebroker.v1 import common_pb2 as pb
from tests.fixtures.cluster import ROOT, _kill_leftover_trainers, free_port, wait_until

pytestmark = pytest.mark.slow

TERMINAL = {pb.JOB_PHASE_SUCCEEDED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED}

HELLO = '''
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CB_JOB_ID", "CB_ATTEMPT",
        "CB_CHECKPOINT_URI", "CB_RESUME_FROM", "CB_PROGRESS_FILE", "CB_GRACE_S", "GREETING"]
out = {k: os.environ.get(k) for k in keys}
out["cwd"] = os.getcwd()
out["argv"] = sys.argv[1:]
out["data"] = open("data/words.txt").read().strip()
with open(sys.argv[sys.argv.index("--out") + 1], "w") as f:
    json.dump(out, f)
print("hello from rank", os.environ["RANK"])
'''


def readme_commands() -> dict[str, str]:
    """The by-hand walkthrough's dev-ca / serve / agent commands (examples/walkthrough.sh,
    shown verbatim by docs/operator/by-hand.md; joined across `\\` continuations), with
    its port variables at their defaults and its examples/ paths relative to a checkout."""
    block = (ROOT / "examples" / "walkthrough.sh").read_text().replace("\\\n", " ")
    block = (block.replace("$AGENT_PORT", "50052").replace("$PORT", "50051")
             .replace('"$EXAMPLES/', "examples/").replace('.yaml"', ".yaml")
             .replace('"${as_root[@]}"', ""))
    cmds = {}
    for line in block.splitlines():
        words = line.split(" #", 1)[0].strip().rstrip("&").split()
        if words[:1] == ["brokerctl"] and len(words) > 1:
            cmds.setdefault(words[1], " ".join(words))
    return cmds


def readme_byo_submit() -> str:
    """The submit line of the docs' "Bring your own training code" page."""
    section = (ROOT / "docs" / "user" / "bring-your-own-code.md").read_text()
    found = re.search(r"`(brokerctl submit [^`]*-- python train\.py)`", section.replace("\n", " "))
    assert found, "no `brokerctl submit ... -- python train.py` on the docs' BYO page"
    return found.group(1)


def brokerctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "brokerctl", *args]


def start(argv: list[str], home: Path, log: str) -> subprocess.Popen[bytes]:
    fh = open(home / log, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(argv, cwd=home, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"},
                                start_new_session=True)
    finally:
        fh.close()


def test_readme_commands_relative_paths_and_own_code(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    (home / "examples").mkdir(parents=True)
    shutil.copytree(ROOT / "examples" / "inventories", home / "examples" / "inventories")
    cmds = readme_commands()
    port = free_port()
    addr = f"127.0.0.1:{port}"
    agent_addr = f"127.0.0.1:{free_port()}"
    serve = cmds["serve"].split()[1:]
    agent = cmds["agent"].split()[1:]
    # The walkthrough's exact commands, with free ports in place of 50051 and 50052.
    assert "--work-dir" in agent and not agent[agent.index("--work-dir") + 1].startswith("/")
    serve = [w.replace("127.0.0.1:50051", addr).replace("127.0.0.1:50052", agent_addr) for w in serve]
    agent = [w.replace("127.0.0.1:50052", agent_addr) for w in agent]
    if os.geteuid() == 0 and "--allow-root-jobs" not in agent:
        agent += ["--allow-root-jobs"]  # this test host runs as root (docs: Job user)
    # Its dev CA first; then every client here uses its config (the `admin` context).
    dev_ca = [w.replace("127.0.0.1:50051", addr).replace("127.0.0.1:50052", agent_addr)
              for w in cmds["dev-ca"].split()[1:]]
    assert subprocess.run(brokerctl(*dev_ca), cwd=home).returncode == 0
    for var in ("CB_TOKEN", "CB_CA", "CB_CONTEXT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CB_CONFIG", str(home / "var" / "pki" / "config.yaml"))
    procs = [start(brokerctl(*serve), home, "broker.log")]
    try:
        procs.append(start(brokerctl(*agent, "--ranks-per-node", "1"), home, "agent.log"))

        def logs() -> str:
            return "\n".join((home / n).read_text(errors="replace")[-3000:]
                             for n in ("broker.log", "agent.log"))

        client = BrokerClient(addr, timeout=20)
        wait_until(lambda: client.regions(), 120, what="the agent to register")
        teams = cmds["teams"].split()[1:]
        assert subprocess.run(brokerctl("--broker", addr, *teams), cwd=home).returncode == 0

        # 1. Your own code, from a directory, through the CLI.
        code = home / "code"
        (code / "data").mkdir(parents=True)
        (code / "hello.py").write_text(HELLO)
        (code / "data" / "words.txt").write_text("bring your own code\n")
        res = subprocess.run(
            brokerctl("--broker", addr, "submit", "--name", "hello", "--team", "ml",
                      "--env", "GREETING=hi", "--workdir", "code", "--",
                      "python", "hello.py", "--out", "result.json"),
            cwd=home, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        job_id = re.search(r"submitted job (\S+)", res.stdout).group(1)
        job = wait_until(lambda: (j := client.get_job(job_id)).phase in TERMINAL and j, 300,
                         what=f"job {job_id} to finish\n{logs()}")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message + logs()
        adir = home / "var" / "agents" / "us-east-2" / "jobs" / job_id / "attempt-1"
        out = json.loads((adir / "workdir" / "result.json").read_text())
        assert out["cwd"] == str(adir / "workdir")
        assert out["data"] == "bring your own code" and out["argv"] == ["--out", "result.json"]
        assert out["RANK"] == "0" and out["WORLD_SIZE"] == "1" and out["MASTER_ADDR"]
        assert out["GREETING"] == "hi" and out["CB_JOB_ID"] == job_id and out["CB_GRACE_S"]
        assert out["CB_RESUME_FROM"] == ""
        for key in ("CB_CHECKPOINT_URI", "CB_PROGRESS_FILE"):
            assert os.path.isabs(out[key]), (key, out[key])
        assert out["CB_CHECKPOINT_URI"].startswith(str(home / "var/regions/us-east-2/checkpoints"))
        assert "hello from rank 0" in (adir / "rank-0.stdout").read_text()
        shown = subprocess.run(brokerctl("--broker", addr, "job", job_id), cwd=home,
                               capture_output=True, text=True, timeout=60)
        assert "restarts from the beginning" in shown.stdout

        # 2. The built-in trainer with the inventory's relative bucket: checkpoints land
        #    in <home>/var/regions/us-east-2/checkpoints, where the broker says they are.
        h = client.submit({"name": "tiny", "team": "ml", "trainer": {
            "total_steps": 6, "checkpoint_every": 3, "model": "tiny"}})
        job = wait_until(lambda: (j := h.status()).phase in TERMINAL and j, 300,
                         what=f"trainer job to finish\n{logs()}")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message + logs()
        uri = job.progress.last_checkpoint_uri
        assert job.progress.last_checkpoint_step == 6 and job.progress.step == 6
        assert uri.startswith(str(home / "var" / "regions" / "us-east-2" / "checkpoints")), uri
        assert Path(uri).is_dir()
        assert "no checkpoint" not in subprocess.run(
            brokerctl("--broker", addr, "job", h.id), cwd=home, capture_output=True,
            text=True, timeout=60).stdout

        # 3. "Bring your own training code": the docs' submit line, word for word, from
        #    a project holding the library example as train.py (a bare `python`: the
        #    agent's interpreter, the one with torch and the library).
        project = home / "my-project"
        project.mkdir()
        shutil.copy(ROOT / "examples" / "byo" / "train_plain.py", project / "train.py")
        line = readme_byo_submit()
        res = subprocess.run(brokerctl("--broker", addr, *line.split()[1:]), cwd=project,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{line}\n{res.stdout}{res.stderr}"
        job_id = re.search(r"submitted job (\S+)", res.stdout).group(1)
        job = wait_until(lambda: (j := client.get_job(job_id)).phase in TERMINAL and j, 300,
                         what=f"the docs' BYO job to finish\n{logs()}")
        assert job.phase == pb.JOB_PHASE_SUCCEEDED, job.message + logs()
        assert job.progress.step == 200 and job.progress.last_checkpoint_step == 200
        shown = subprocess.run(brokerctl("--broker", addr, "logs", job_id), cwd=home,
                               capture_output=True, text=True, timeout=60).stdout
        assert "trainer: done: 200 steps, final checkpoint durable" in shown, shown
        client.close()
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
        _kill_leftover_trainers(tmp_path)
