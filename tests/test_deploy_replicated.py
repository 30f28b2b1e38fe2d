"""deploy/k8s/replicated: verifier replicas on one PostgreSQL database, offline.

The overlay is the production overlay with one JSON patch (RFC 6902) of the verifier's
Deployment, the SQLite volume claim deleted, and an egress rule to the database. ``render``
applies exactly those (the operations and paths the overlay uses; anything else is refused
here) and was checked by hand against `kubectl kustomize deploy/k8s/replicated`. Checked:

- each patch path lands where its comment says (the value after ``--db``, the ``db`` volume):
  a base edit that moves them fails here, not in a cluster;
- two replicas, every one on the database URL from a Secret, signing with the one key from a
  Secret, no volume claim left;
- the pod still meets Pod Security "restricted", and the objects validate;
- the NetworkPolicies let through what production's do, plus the verifier to the database on
  5432, and nothing else.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO
from tests.test_deploy_manifests import container, one, validate_k8s
from tests.test_deploy_production import (
    MUST,
    PORTS,
    Doc,
    Pod,
    _pod,
    allowed,
    pod_of,
    resources,
    violations,
)
from tests.test_deploy_production import render as render_production

HERE = REPO / "deploy" / "k8s" / "replicated"


def _step(node: Any, part: str) -> Any:
    return node[int(part)] if isinstance(node, list) else node[part]


def json_patch(doc: Doc, ops: list[Doc]) -> None:
    """Apply RFC 6902 OPS to DOC in place: replace, and add (``-`` appends to a list)."""
    for op in ops:
        *parents, last = op["path"].lstrip("/").split("/")
        node: Any = doc
        for part in parents:
            node = _step(node, part)
        value = copy.deepcopy(op["value"])
        if op["op"] == "replace":
            _step(node, last)  # must exist: RFC 6902 refuses a replace of nothing
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        elif op["op"] == "add" and isinstance(node, list):
            node.insert(len(node) if last == "-" else int(last), value)
        elif op["op"] == "add":
            node[last] = value
        else:
            raise AssertionError(f"render: op {op['op']!r} is not one this overlay uses")


def render(kustomization: Path = HERE / "kustomization.yaml") -> list[Doc]:
    kust = yaml.safe_load(kustomization.read_text())
    assert set(kust) <= {"apiVersion", "kind", "resources", "patches"}, sorted(kust)
    docs = resources(kustomization, kust["resources"])
    for p in kust["patches"]:
        if "path" in p:
            ops = yaml.safe_load((kustomization.parent / p["path"]).read_text())
            target = one(docs, p["target"]["kind"], p["target"]["name"])
            json_patch(target, ops)
            continue
        body = yaml.safe_load(p["patch"])
        assert body.pop("$patch") == "delete", body
        gone = one(docs, body["kind"], body["metadata"]["name"])
        docs.remove(gone)
    return docs


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render()


def verifier_args(docs: list[Doc]) -> list[str]:
    args: list[str] = container(pod_of(docs, "verifier"), "verifier")["args"]
    return args


def test_each_patch_path_is_where_its_comment_says_in_the_base() -> None:
    """args/12 is the value of --db and volumes/2 the db volume, in the base as it is now."""
    base = render_production()
    args = verifier_args(base)
    assert args[11] == "--db" and args[12].endswith(".sqlite3"), args
    assert pod_of(base, "verifier")["volumes"][2]["name"] == "db"


def test_two_replicas_on_the_database_from_a_secret_signing_with_one_key(
    docs: list[Doc],
) -> None:
    d = one(docs, "Deployment", "verifier")
    assert d["spec"]["replicas"] == 2 and d["spec"]["strategy"]["type"] == "RollingUpdate"
    args = verifier_args(docs)
    assert args[args.index("--db") + 1] == "$(VERIFIER_DB_URL)"
    assert args[args.index("--signing-key") + 1] == "/etc/verifier-ledger/signing.key"
    c = container(pod_of(docs, "verifier"), "verifier")
    (url,) = [e for e in c["env"] if e["name"] == "VERIFIER_DB_URL"]
    assert url["valueFrom"]["secretKeyRef"] == {"name": "verifier-postgres", "key": "url"}
    # $(VAR) in args is expanded only for a variable the container's env defines
    assert all("$(" not in a or a == "$(VERIFIER_DB_URL)" for a in args)
    volumes = {v["name"]: v for v in pod_of(docs, "verifier")["volumes"]}
    assert volumes["ledger-key"]["secret"]["secretName"] == "verifier-ledger-key"
    assert "emptyDir" in volumes["db"] and "persistentVolumeClaim" not in volumes["db"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["ledger-key"] == {"name": "ledger-key", "mountPath": "/etc/verifier-ledger",
                                    "readOnly": True}  # fmt: skip
    assert not [x for x in docs if x["kind"] == "PersistentVolumeClaim"]


def test_every_object_validates_and_the_verifier_still_meets_restricted(docs: list[Doc]) -> None:
    for d in docs:
        if d["kind"] != "ServiceMonitor":
            validate_k8s(d)
    assert violations(pod_of(docs, "verifier"), "restricted") == []


def test_the_verifier_reaches_its_database_and_nothing_else_new(docs: list[Doc]) -> None:
    world = {
        "verifier": _pod(docs, "verifier"),
        "vllm": _pod(docs, "vllm"),
        "client": Pod("client", "servewitness", {"servewitness.io/client": "true"}, {}),
        "prometheus": Pod("prometheus", "monitoring", {"app": "prometheus"}, {}),
        "dns": Pod("dns", "kube-system", {"k8s-app": "kube-dns"}, {"dns": 53}),
        "db": Pod("db", "other", {"servewitness.io/verifier-db": "true"}, {"pg": 5432}),
        "internet": Pod("internet", "other", {}, {}),
    }
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    got = {(a, b, port) for a in world for b in world if a != b for port in (*PORTS, 5432)
           if allowed(policies, world[a], world[b], port)}  # fmt: skip
    outside = {"prometheus", "dns", "db", "internet"}
    got = {(a, b, p) for a, b, p in got if not (a in outside and b in outside)}
    assert got == {*MUST, ("verifier", "db", 5432)}, sorted(got ^ {*MUST, ("verifier", "db", 5432)})
    # negative control: without the overlay's rule the verifier has no way to its database
    without = [p for p in policies if p["metadata"]["name"] != "verifier-to-postgres"]
    assert not allowed(without, world["verifier"], world["db"], 5432)
