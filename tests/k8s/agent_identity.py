"""The region agent's identity in the tests: exactly the RBAC of deploy/k8s/agent.yaml.

Why rewrite the manifest instead of applying it as is: every test has its own trainer
namespace (so tests never see each other's pods), so the manifest's ``training`` and
``computebroker`` namespaces become the test's, and the cluster-scoped binding gets a
name per test. Nothing else is changed: the Roles, ClusterRole and their verbs are the
manifest's own, so a permission the executor needs but the manifest lacks fails a test.
The admission policy that confines trainer tokens to their own pod's progress annotation
is applied as is (cluster-wide, the same for every test). The Deployment is left out (the node fixture runs no images; the dry-run test checks it).
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from tests.fixtures.k8s.controlplane import REPO, ControlPlane
from tests.k8s.conftest import make_namespace

AGENT_YAML = REPO / "deploy" / "k8s" / "agent.yaml"
RBAC_KINDS = {"ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
AGENT_SA = "region-agent"
TRAINER_SA = "trainer"


def rbac_docs(train_ns: str, agent_ns: str) -> list[dict]:
    """agent.yaml's RBAC objects, moved to ``train_ns`` / ``agent_ns``."""
    out = []
    for doc in yaml.safe_load_all(AGENT_YAML.read_text()):
        if not doc or doc["kind"] not in RBAC_KINDS:
            continue
        d = copy.deepcopy(doc)
        meta = d["metadata"]
        ns = {"training": train_ns, "computebroker": agent_ns}
        if "namespace" in meta:
            meta["namespace"] = ns[meta["namespace"]]
        if d["kind"] == "ClusterRoleBinding":
            meta["name"] = f"{meta['name']}-{agent_ns}"
        for s in d.get("subjects") or []:
            if "namespace" in s:
                s["namespace"] = ns[s["namespace"]]
        out.append(d)
    return out


def agent_kubeconfig(cp: ControlPlane, train_ns: str) -> Path:
    """Apply agent.yaml's RBAC for ``train_ns`` (a namespace of its own for the agent)
    and return a kubeconfig with the agent service account's bound token."""
    agent_ns = make_namespace(cp, prefix="cb-agent", restricted=False)
    cp.apply_manifests(rbac_docs(train_ns, agent_ns))
    return cp.kubeconfig_for_service_account(agent_ns, AGENT_SA)
