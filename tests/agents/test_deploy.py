"""deploy/: manifests parse as Kubernetes objects and the agent's RBAC covers the
API calls the Kubernetes executor makes (no cluster here: static checks only)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def test_manifests_have_expected_kinds():
    kinds = {(d["kind"], d["metadata"]["name"]) for f in ("namespace.yaml", "broker.yaml", "agent.yaml")
             for d in docs(f)}
    assert ("Deployment", "broker") in kinds and ("Service", "broker") in kinds
    assert ("Deployment", "region-agent") in kinds and ("ServiceAccount", "region-agent") in kinds
    for d in docs("broker.yaml") + docs("agent.yaml"):
        assert d["apiVersion"] and d["metadata"]["name"]


def test_agent_rbac_covers_executor_calls():
    rules = [r for d in docs("agent.yaml") if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]

    def allowed(group: str, resource: str, verb: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
                   for r in rules)

    # region_agents/executors/kubernetes.py: list_node, create/list/delete jobs (the
    # memory keepers), create/list/delete services, create/list pods and delete them by
    # name (never a collection: a sweep reads every pod of the namespace).
    assert allowed("", "nodes", "list")
    for verb in ("create", "list", "delete"):
        assert allowed("batch", "jobs", verb)
        assert allowed("", "services", verb)
        assert allowed("", "pods", verb)
    assert not allowed("", "pods", "deletecollection")
    agent = next(d for d in docs("agent.yaml") if d["kind"] == "Deployment")
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "agent" and "--executor=kubernetes" in args
    # The trainer pods' account may read its pod (checkpoint_layout/pod_deadline.py), and
    # the agent names it.
    sa = next(a.split("=", 1)[1] for a in args if a.startswith("--service-account="))
    binding = next(d for d in docs("agent.yaml") if d["kind"] == "RoleBinding"
                   and any(s["name"] == sa for s in d["subjects"]))
    role = next(d for d in docs("agent.yaml") if d["kind"] == "Role"
                and d["metadata"]["name"] == binding["roleRef"]["name"])
    assert any("" in r["apiGroups"] and "pods" in r["resources"] and "get" in r["verbs"]
               for r in role["rules"])
    assert ("ServiceAccount", sa) in {(d["kind"], d["metadata"]["name"]) for d in docs("agent.yaml")}
    assert any(a.startswith("--broker=") for a in args) and any(a.startswith("--region=") for a in args)


def test_dashboard_is_valid_json():
    dash = json.loads((DEPLOY / "grafana" / "compute-broker.json").read_text())
    assert dash["panels"] and all(p["targets"] for p in dash["panels"])


def test_dockerfile_says_it_is_not_built_here():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert "NOT BUILDABLE" in text and "ENTRYPOINT" in text


def test_dockerfile_copies_every_installed_package():
    """`pip install .` in the image installs what pyproject.toml finds: a package not
    copied is silently missing (the image once lacked checkpoint_layout, which the agent
    and the trainer's preStop hook import)."""
    import fnmatch
    import tomllib

    root = DEPLOY.parent
    find = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    tops = {p.name for where in find["where"] for p in (root / where).iterdir()
            if p.is_dir() and (p / "__init__.py").exists()
            and any(fnmatch.fnmatch(p.name, pat) for pat in find["include"])}
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    copied = {line.split()[1] for line in text.splitlines() if line.startswith("COPY ")}
    assert "computebroker" in tops and "proto" in copied  # the stubs live under proto/
    assert tops - {"computebroker"} <= copied, sorted(tops - {"computebroker"} - copied)
