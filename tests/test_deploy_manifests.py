"""deploy/: the Kubernetes manifests are valid objects and the compose file a valid project,
offline; and both keep the invariants a schema cannot see (the agent shares vLLM's PID
namespace with SYS_PTRACE as root, reaches the verifier where it listens, the policies load).

Kubernetes objects are checked against the JSON schemas that kubernetes-validate bundles
(strict: unknown fields are errors), no cluster and no network needed. The compose file is
checked by the installed Compose (`docker compose` or docker-compose 1.29) and by its own
parse; no container is started. The healthchecks are run for real against a local verifier,
agent and HTTP server.
"""

from __future__ import annotations

import copy
import http.server
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from servewitness.policy import PolicyError, load_policy
from tests.helpers import REPO, VENV_BIN

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s" / "base"  # the base manifests; deploy/k8s/production: test_deploy_production
COMPOSE = DEPLOY / "compose.yaml"
POLICY = DEPLOY / "policy.toml"

# The Kubernetes version whose schemas the manifests must satisfy: gRPC probes are GA from 1.27.
K8S_VERSION = "1.30.0"

Doc = dict[str, Any]


# --- the validator ------------------------------------------------------------------------


class ManifestError(AssertionError):
    """A Kubernetes object the schema of K8S_VERSION rejects (or has no schema for)."""


def validate_k8s(doc: Doc) -> None:
    """Validate one Kubernetes object against the bundled schema of K8S_VERSION, strictly
    (unknown fields are errors). Raises ManifestError naming the object and the field."""
    what = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    try:
        used = kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        raise ManifestError(f"{what}: {path}: {e.message}") from None
    except kubernetes_validate.SchemaNotFoundError as e:
        raise ManifestError(f"{what}: {e.message}") from None
    assert used == K8S_VERSION.rsplit(".", 1)[0], f"validated against {used}, not {K8S_VERSION}"


CERT_MANAGER = (
    DEPLOY / "k8s" / "cert-manager.yaml"
)  # cert-manager's kinds: no bundled schema, own tests


def k8s_files() -> list[Path]:
    """The manifests (kustomization.yaml is kustomize's configuration, not an API object;
    cert-manager.yaml is an optional example of cert-manager's own kinds)."""
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def load_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


@pytest.fixture(scope="module")
def k8s_docs() -> list[Doc]:
    docs = [d for p in k8s_files() for d in load_docs(p)]
    assert docs, f"no manifests in {K8S}"
    return docs


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(pod_spec: Doc, name: str) -> Doc:
    found: list[Doc] = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"container {name}: {len(found)} found"
    return found[0]


def flag(args: list[str], name: str) -> str:
    """The value of `--name VALUE` (exactly once) in ARGS."""
    at = [i for i, a in enumerate(args) if a == name]
    assert len(at) == 1, f"{name} appears {len(at)} times in {args}"
    return args[at[0] + 1]


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# --- Kubernetes: schema ---------------------------------------------------------------------


@pytest.mark.parametrize("path", k8s_files(), ids=lambda p: p.name)
def test_every_k8s_document_validates(path: Path) -> None:
    docs = load_docs(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        validate_k8s(doc)


def _vllm_pod(docs: list[Doc]) -> Doc:
    pod: Doc = one(docs, "Deployment", "vllm")["spec"]["template"]["spec"]
    return pod


MUTATIONS: dict[str, tuple[Callable[[Doc], None], str]] = {
    "misspelled pod field": (
        lambda d: d["spec"]["template"]["spec"].update(
            shareProcessNamespac=d["spec"]["template"]["spec"].pop("shareProcessNamespace")
        ),
        "'shareProcessNamespac' was unexpected",
    ),
    "misspelled field deep in a probe": (
        lambda d: d["spec"]["template"]["spec"]["containers"][1]["livenessProbe"]["grpc"].update(
            prot=50552
        ),
        "'prot' was unexpected",
    ),
    "wrong type": (
        lambda d: d["spec"].update(replicas="one"),
        "'one' is not of type 'integer'",
    ),
    "probe port as a string where an integer is required": (
        lambda d: d["spec"]["template"]["spec"]["containers"][1]["readinessProbe"]["grpc"].update(
            port="50552"
        ),
        "'50552' is not of type 'integer'",
    ),
    "missing required field": (
        lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),
        "'name' is a required property",
    ),
    "missing selector": (
        lambda d: d["spec"].pop("selector"),
        "'selector' is a required property",
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_the_validator_rejects_a_broken_copy(k8s_docs: list[Doc], case: str) -> None:
    """Negative controls: the same validator function rejects a broken copy of a manifest
    that it accepts as written."""
    mutate, message = MUTATIONS[case]
    good = one(k8s_docs, "Deployment", "vllm")
    validate_k8s(good)
    bad = copy.deepcopy(good)
    mutate(bad)
    with pytest.raises(ManifestError, match=message):
        validate_k8s(bad)


def test_the_validator_rejects_an_unknown_kind() -> None:
    doc = {"apiVersion": "v1", "kind": "Deploymnet", "metadata": {"name": "x"}}
    with pytest.raises(ManifestError, match="Couldn't find schema"):
        validate_k8s(doc)


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == [p.name for p in k8s_files()]
    assert "namespace" not in kust, "namespace-agnostic: the namespace is the applier's choice"
    # `kubectl apply -k deploy/k8s` is the base
    top = yaml.safe_load((K8S.parent / "kustomization.yaml").read_text())
    assert top["resources"] == ["base"] and "namespace" not in top


# --- Kubernetes: invariants the schema cannot see --------------------------------------------


def test_manifests_are_namespace_agnostic(k8s_docs: list[Doc]) -> None:
    for doc in k8s_docs:
        assert "namespace" not in doc["metadata"], f"{doc['kind']}/{doc['metadata']['name']}"


def test_vllm_pod_shares_its_pid_namespace_with_the_agent(k8s_docs: list[Doc]) -> None:
    deploy = one(k8s_docs, "Deployment", "vllm")
    pod = _vllm_pod(k8s_docs)
    assert pod["shareProcessNamespace"] is True
    assert {c["name"] for c in pod["containers"]} == {"vllm", "agent"}
    # vLLM reads VLLM_PORT; a Service "vllm" would set it to tcp://IP:8000 through service links.
    assert pod["enableServiceLinks"] is False
    # each pod reports as an instance vllm/<pod>, and the run needs as many as there are
    # replicas; Recreate: a rollout never has old and new pods reporting at once
    policy = load_policy(_configmap_policy(k8s_docs), "policy-configmap.yaml")
    assert deploy["spec"]["replicas"] == policy.selection.min_targets >= 2
    assert deploy["spec"]["strategy"]["type"] == "Recreate"


def test_agent_runs_as_root_with_sys_ptrace_and_scans(k8s_docs: list[Doc]) -> None:
    agent = container(_vllm_pod(k8s_docs), "agent")
    sc = agent["securityContext"]
    assert sc["runAsUser"] == 0
    assert sc.get("runAsNonRoot") is not True
    # SYS_PTRACE and nothing else (root reads what root, vLLM's user, owns without DAC caps)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc.get("privileged") is not True, "SYS_PTRACE is enough; privileged is not needed"
    # PID 1 of a shared namespace is the pause container: the agent must scan, not follow a pid
    assert "--pid" not in agent["args"]
    assert agent["args"][0] == "agent"


def test_every_container_has_resources_and_probes(k8s_docs: list[Doc]) -> None:
    for deploy in (d for d in k8s_docs if d["kind"] == "Deployment"):
        pod = deploy["spec"]["template"]["spec"]
        for c in pod["containers"]:
            where = f"{deploy['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            assert {"cpu", "memory"} <= set(res.get("requests", {})), where
            assert "memory" in res.get("limits", {}), where
            for probe in ("readinessProbe", "livenessProbe"):
                assert probe in c, f"{where}: no {probe}"
                _probe_port_is_declared(c, c[probe], where)
            if "startupProbe" in c:
                _probe_port_is_declared(c, c["startupProbe"], where)


def _probe_port_is_declared(c: Doc, probe: Doc, where: str) -> None:
    (kind,) = {"httpGet", "grpc", "tcpSocket", "exec"} & set(probe)
    if kind == "exec":
        return
    port = probe[kind]["port"]
    declared = {p["containerPort"] for p in c.get("ports", [])} | {
        p["name"] for p in c.get("ports", []) if "name" in p
    }
    assert port in declared, f"{where}: probe port {port} is not a declared container port"


def test_vllm_container_probes_health_and_has_time_to_load(k8s_docs: list[Doc]) -> None:
    vllm = container(_vllm_pod(k8s_docs), "vllm")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert vllm[probe]["httpGet"]["path"] == "/health", probe
    startup = vllm["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, "model load needs time"
    assert flag(vllm["args"], "--port") == "8000"
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in vllm["ports"]


def test_vllm_container_has_shm_a_probe_dir_and_the_step_hook(k8s_docs: list[Doc]) -> None:
    pod = _vllm_pod(k8s_docs)
    vllm = container(pod, "vllm")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VERIFIER_PROBE_DIR"] in mounts, "the probe dir must be a writable mount"
    assert "step" in _hooks_declared(env["VERIFIER_HOOKS"])
    _no_empty_kv_cache_space(env)
    # the agent reads the probe dir through /proc/<pid>/root: it mounts nothing of vllm's
    agent = container(pod, "agent")
    assert mounts[env["VERIFIER_PROBE_DIR"]] not in {m["name"] for m in agent["volumeMounts"]}


def _hooks_declared(spec: str) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in spec.split(","))


def _no_empty_kv_cache_space(env: dict[str, Any]) -> None:
    value = env.get("VLLM_CPU_KVCACHE_SPACE")
    assert value is None or str(value).isdigit(), f"VLLM_CPU_KVCACHE_SPACE={value!r}"


def _service_for(docs: list[Doc], deploy: Doc) -> Doc:
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    found = [
        d
        for d in docs
        if d["kind"] == "Service" and d["spec"]["selector"].items() <= labels.items()
    ]
    assert len(found) == 1, f"services selecting {deploy['metadata']['name']}: {len(found)}"
    return found[0]


def test_agent_reports_to_the_verifier_service(k8s_docs: list[Doc]) -> None:
    verifier_deploy = one(k8s_docs, "Deployment", "verifier")
    verifier = container(verifier_deploy["spec"]["template"]["spec"], "verifier")
    listen_port = port_of(flag(verifier["args"], "--listen"))
    svc = _service_for(k8s_docs, verifier_deploy)
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    target_port = svc_port["targetPort"]
    named = {p["name"]: p["containerPort"] for p in verifier["ports"]}
    assert named.get(target_port, target_port) == listen_port

    agent = container(_vllm_pod(k8s_docs), "agent")
    assert flag(agent["args"], "--verifier") == f"{svc['metadata']['name']}:{svc_port['port']}"
    # the agent's health port is where its probes look: liveness the process (""),
    # readiness its delivery (READY_SERVICE: acknowledged reports of a visible vLLM)
    from servewitness.agent.runner import READY_SERVICE

    health_port = port_of(flag(agent["args"], "--health"))
    assert agent["livenessProbe"]["grpc"]["port"] == health_port
    assert agent["livenessProbe"]["grpc"].get("service", "") == ""
    assert agent["readinessProbe"]["grpc"] == {"port": health_port, "service": READY_SERVICE}


def test_vllm_service_reaches_the_api_port(k8s_docs: list[Doc]) -> None:
    deploy = one(k8s_docs, "Deployment", "vllm")
    svc = _service_for(k8s_docs, deploy)
    assert svc["metadata"]["name"] == "vllm"
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == "http"]
    assert port["port"] == 8000
    assert port["targetPort"] == "http"


def test_verifier_probes_the_service_it_serves(k8s_docs: list[Doc]) -> None:
    from servewitness.server.app import SERVICE_NAME

    verifier = container(
        one(k8s_docs, "Deployment", "verifier")["spec"]["template"]["spec"], "verifier"
    )
    ready = verifier["readinessProbe"]["grpc"]
    assert ready["service"] == SERVICE_NAME
    # the kubelet's gRPC probes present no client certificate: the plaintext health port
    health = port_of(flag(verifier["args"], "--health-listen"))
    assert ready["port"] == health and verifier["livenessProbe"]["grpc"]["port"] == health
    assert health != port_of(flag(verifier["args"], "--listen"))


def test_verifier_registers_the_configmap_policy(k8s_docs: list[Doc]) -> None:
    deploy = one(k8s_docs, "Deployment", "verifier")
    pod = deploy["spec"]["template"]["spec"]
    verifier = container(pod, "verifier")
    name, path = flag(verifier["args"], "--run").split("=", 1)
    assert name == "vllm"
    policy_path = PurePosixPath(path)
    (mount,) = [m for m in verifier["volumeMounts"] if m["mountPath"] == str(policy_path.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = one(k8s_docs, "ConfigMap", volume["configMap"]["name"])
    assert policy_path.name in cm["data"]
    # the database lives on a volume, not in the container's writable layer
    db = PurePosixPath(flag(verifier["args"], "--db"))
    assert str(db.parent) in {m["mountPath"] for m in verifier["volumeMounts"]}


def _configmap_policy(docs: list[Doc]) -> str:
    text: str = one(docs, "ConfigMap", "verifier-policy")["data"]["policy.toml"]
    return text


def test_configmap_policy_loads(k8s_docs: list[Doc]) -> None:
    """The agent of every pod reports as an instance of its --target, named by its pod
    (downward API), and the policy covers every instance of that family."""
    policy = load_policy(_configmap_policy(k8s_docs), "policy-configmap.yaml")
    agent = container(_vllm_pod(k8s_docs), "agent")
    assert policy.selection.names == ()
    assert policy.selection.replicas_of == (flag(agent["args"], "--target"),)
    assert flag(agent["args"], "--instance") == "$(VERIFIER_POD_NAME)"
    env = {e["name"]: e for e in agent["env"]}
    assert env["VERIFIER_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_configmap_policy_binds_the_target_to_a_label_of_the_serving_pod(
    k8s_docs: list[Doc],
) -> None:
    """No Docker API in a pod: the binding is to a pod label, one the vLLM pod template carries
    and the Service selects its serving pods by, and the agent is told its pod (uid, name,
    namespace, labels) through the downward API, as servewitness.agent.containers.OwnPod reads
    it."""
    data = tomllib.loads(_configmap_policy(k8s_docs))
    assert "container_ids" not in data["targets"]
    (target, spec) = data["targets"]["containers"].popitem()
    key, _, value = spec.removeprefix("label:").partition("=")
    deploy = one(k8s_docs, "Deployment", "vllm")
    assert deploy["spec"]["template"]["metadata"]["labels"][key] == value
    assert _service_for(k8s_docs, deploy)["spec"]["selector"][key] == value
    pod = _vllm_pod(k8s_docs)
    agent = container(pod, "agent")
    assert flag(agent["args"], "--target") == target
    assert "--no-docker" in agent["args"]
    env = {e["name"]: e for e in agent["env"]}
    for name, field in (("VERIFIER_POD_UID", "metadata.uid"),
                        ("VERIFIER_POD_NAME", "metadata.name"),
                        ("VERIFIER_POD_NAMESPACE", "metadata.namespace")):  # fmt: skip
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == field
    labels = PurePosixPath(env["VERIFIER_POD_LABELS"]["value"])
    (mount,) = [m for m in agent["volumeMounts"] if m["mountPath"] == str(labels.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (item,) = [i for i in volume["downwardAPI"]["items"] if i["path"] == labels.name]
    assert item["fieldRef"]["fieldPath"] == "metadata.labels"


def _without_container_binding(data: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    targets = out.get("targets", {})
    targets.pop("containers", None)
    # the target selection differs too: compose's one target, Kubernetes' one per pod
    for key in ("names", "replicas_of", "min_targets"):
        targets.pop(key, None)
    return out


def test_configmap_policy_is_the_compose_policy_less_the_container_binding(
    k8s_docs: list[Doc],
) -> None:
    k8s = tomllib.loads(_configmap_policy(k8s_docs))
    compose = tomllib.loads(POLICY.read_text())
    assert _without_container_binding(k8s) == _without_container_binding(compose)
    assert k8s["targets"]["containers"].keys() == compose["targets"]["containers"].keys()


def test_policy_requires_the_step_hook_on_decode_steps() -> None:
    data = tomllib.loads(POLICY.read_text())
    (step,) = [h for h in data["hooks"] if h["name"] == "step"]
    assert step["on"] == "decode"


# --- compose: invariants ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> Doc:
    doc: Doc = yaml.safe_load(COMPOSE.read_text())
    assert "version" not in doc, "Compose Specification: no version key"
    assert set(doc["services"]) == {"certs", "verifier", "pidns", "vllm", "agent"}
    return doc


def test_compose_images_can_be_overridden(compose: Doc) -> None:
    s = compose["services"]
    assert s["verifier"]["image"] == "${VERIFIER_IMAGE:-verifier:local}"
    assert s["agent"]["image"] == "${VERIFIER_IMAGE:-verifier:local}"
    assert s["certs"]["image"] == "${VERIFIER_IMAGE:-verifier:local}"
    assert s["pidns"]["image"] == "${VERIFIER_IMAGE:-verifier:local}"
    assert s["vllm"]["image"] == "${VLLM_IMAGE:-verifier-vllm:local}"


def test_compose_agent_shares_vllm_pid_namespace_as_root_with_ptrace(compose: Doc) -> None:
    s = compose["services"]
    agent = s["agent"]
    # vLLM and the agent share the namespace pidns owns: vLLM restarts, the agent stays
    assert agent["pid"] == s["vllm"]["pid"] == "service:pidns"
    assert s["pidns"]["init"] is True, "the namespace's PID 1 must reap what vLLM leaves"
    assert s["pidns"]["restart"] == "unless-stopped"
    assert agent["cap_add"] == ["SYS_PTRACE"] and agent["cap_drop"] == ["ALL"]
    assert agent["user"] in ("root", "0", 0, "0:0")
    assert agent.get("privileged") is not True
    assert "/var/run/docker.sock:/var/run/docker.sock:ro" in agent["volumes"]
    assert set(agent["depends_on"]) == {"certs", "pidns", "verifier"}
    assert "vllm" not in agent["depends_on"], "a vLLM restart must not need a new agent"
    assert "--pid" not in agent["command"]
    assert agent["restart"] in ("unless-stopped", "on-failure", "always")


def test_compose_services_are_hardened(compose: Doc) -> None:
    """Every service drops every capability and cannot gain privileges; only the agent gets
    one back (SYS_PTRACE) and certs two (CHOWN, DAC_OVERRIDE: it hands the verifier its keys);
    the verifier, the agent and pidns have read-only root filesystems; nothing is
    privileged, and only the agent and certs run as root (the verifier as the image's user)."""
    s = compose["services"]
    extra = {"agent": ["SYS_PTRACE"], "certs": ["CHOWN", "DAC_OVERRIDE"]}
    for name, svc in s.items():
        assert svc["cap_drop"] == ["ALL"], name
        assert svc.get("cap_add", []) == extra.get(name, []), name
        assert "no-new-privileges:true" in svc["security_opt"], name
        assert svc.get("privileged") is not True, name
    for name in ("verifier", "agent", "pidns"):
        assert s[name]["read_only"] is True, name
    assert "user" not in s["verifier"], "the verifier runs as the image's user (10001)"
    assert {n for n, svc in s.items() if str(svc.get("user")) in ("root", "0")} == {
        "agent",
        "certs",
    }
    assert "chown -R 10001:10001 /pki/verifier" in s["certs"]["command"][0]


def test_compose_agent_reports_to_the_verifier(compose: Doc) -> None:
    s = compose["services"]
    listen = flag(s["verifier"]["command"], "--listen")
    assert flag(s["agent"]["command"], "--verifier") == f"verifier:{port_of(listen)}"
    target = flag(s["agent"]["command"], "--target")
    assert tomllib.loads(POLICY.read_text())["targets"]["names"] == [target]


def test_compose_verifier_registers_the_mounted_policy(compose: Doc) -> None:
    verifier = compose["services"]["verifier"]
    assert verifier["command"][0] == "serve"
    name, path = flag(verifier["command"], "--run").split("=", 1)
    assert name == "vllm"
    assert f"./policy.toml:{path}:ro" in verifier["volumes"]
    db = PurePosixPath(flag(verifier["command"], "--db"))
    named = {v.split(":")[1] for v in verifier["volumes"] if v.split(":")[0] in compose["volumes"]}
    assert str(db.parent) in named, "the database lives on a named volume"
    assert "healthcheck" in verifier


def test_compose_vllm_service(compose: Doc) -> None:
    vllm = compose["services"]["vllm"]
    assert vllm["shm_size"] == "1g"
    env = vllm["environment"]
    assert "step" in _hooks_declared(env["VERIFIER_HOOKS"])
    assert env["VERIFIER_PROBE_DIR"] in vllm["tmpfs"], "the probe dir must be writable"
    _no_empty_kv_cache_space(env)
    assert flag(vllm["command"], "--port") == "8000"
    assert any(str(p).endswith(":8000") for p in vllm["ports"])
    assert "/health" in " ".join(vllm["healthcheck"]["test"])


def test_compose_policy_binds_target_vllm_to_the_compose_service() -> None:
    data = tomllib.loads(POLICY.read_text())
    assert data["targets"]["containers"] == {"vllm": "label:com.docker.compose.service=vllm"}


def test_compose_policy_loads() -> None:
    """The whole of deploy/policy.toml, [targets.containers] included, is a valid policy."""
    policy = load_policy(POLICY.read_text(), str(POLICY))
    assert policy.selection.names == ("vllm",)


def test_compose_policy_rules_load_without_the_container_binding() -> None:
    """Everything else in deploy/policy.toml is valid on its own: a failure of the test above
    that this one does not share is about [targets.containers] alone."""
    text = POLICY.read_text()
    lines = text.splitlines(keepends=True)
    start = lines.index("[targets.containers]\n")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("["))
    stripped = "".join(lines[:start] + lines[end:])
    assert "containers" not in tomllib.loads(stripped)["targets"]
    policy = load_policy(stripped, str(POLICY))
    assert policy.selection.names == ("vllm",)
    with pytest.raises(PolicyError):  # the loader is live: a typo in the same text is refused
        load_policy(stripped.replace('on = "decode"', 'on = "decoding"'), str(POLICY))


# --- the early probe: on by default in what the project ships ----------------------------------

IMAGE = REPO / "agents" / "vllm"


def test_the_shipped_image_and_manifests_start_the_probe_early(
    k8s_docs: list[Doc], compose: Doc
) -> None:
    """Without the early probe, what vLLM imports before it loads its plugins is hashed from
    disk after the fact (``provenance.file.hashed_after``): the image, the compose file and
    the Kubernetes manifests all start it at interpreter start-up."""
    dockerfile = (IMAGE / "Dockerfile").read_text()
    env_block = dockerfile[dockerfile.index("\nENV ") :].split("\n\n")[0]
    assert "VERIFIER_PROBE_EARLY=1" in env_block.split(), env_block
    assert compose["services"]["vllm"]["environment"]["VERIFIER_PROBE_EARLY"] == "1"
    vllm = container(_vllm_pod(k8s_docs), "vllm")
    assert {e["name"]: e.get("value") for e in vllm["env"]}["VERIFIER_PROBE_EARLY"] == "1"


def _entrypoint_check(python: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIFIER_")}
    env.update(VERIFIER_PYTHON=python, VERIFIER_PROBE_EARLY="1", TMPDIR=str(tmp))
    return subprocess.run(["sh", str(IMAGE / "entrypoint.sh"), "--check"], env=env,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_the_entrypoint_checks_that_the_probe_starts_early(tmp_path: Path) -> None:
    """The image's entrypoint refuses an interpreter in which the early probe's ``.pth`` line
    does not run (here: a wrapper that runs Python without its site directories for ``-c``,
    as if the package had been installed without it); this environment's passes."""
    ok = _entrypoint_check(sys.executable, tmp_path)
    assert ok.returncode == 0, ok.stderr
    wrapper = tmp_path / "python-without-pth"
    wrapper.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} -S "$@"; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    refused = _entrypoint_check(str(wrapper), tmp_path)
    assert refused.returncode == 1
    assert "the early probe (VERIFIER_PROBE_EARLY) does not start" in refused.stderr
    assert [p.name for p in tmp_path.iterdir()] == [wrapper.name]  # no probe state left


# --- compose: the installed Compose accepts it -----------------------------------------------


def compose_clis() -> list[list[str]]:
    """Every Compose installed here: the v2 plugin (or a shim) and docker-compose 1.x."""
    clis: list[list[str]] = []
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run(
            [docker, "compose", "version"], check=False, capture_output=True, text=True, timeout=60
        )
        if probe.returncode == 0:
            clis.append([docker, "compose"])
    v1 = shutil.which("docker-compose")
    if v1:
        clis.append([v1])
    return clis


def _compose_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VERIFIER_IMAGE", "VLLM_IMAGE", "VERIFIER_PORT", "VLLM_PUBLISH"}
        and not k.startswith("COMPOSE_")
    }
    env.update(extra)
    return env


def _run_compose(
    cli: list[str], path: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cli, "-f", str(path), "--project-directory", str(path.parent), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=_compose_env(**env),
    )


@pytest.fixture(scope="module")
def clis() -> list[list[str]]:
    found = compose_clis()
    if not found:
        pytest.fail(
            "neither `docker compose` nor `docker-compose` is installed: install it "
            "(apt-get install -y docker-compose), as CI does, to check deploy/compose.yaml"
        )
    return found


def test_compose_config_accepts_the_file(clis: list[list[str]]) -> None:
    for cli in clis:
        out = _run_compose(cli, COMPOSE, "config", "-q")
        assert out.returncode == 0, f"{shlex.join(cli)} config -q: {out.stderr}"


def test_compose_config_resolves_images_and_the_pid_namespace(clis: list[list[str]]) -> None:
    for cli in clis:
        out = _run_compose(cli, COMPOSE, "config", VERIFIER_IMAGE="reg.example/verifier:1")
        assert out.returncode == 0, f"{shlex.join(cli)} config: {out.stderr}"
        resolved = yaml.safe_load(out.stdout)["services"]
        assert resolved["verifier"]["image"] == "reg.example/verifier:1"
        assert resolved["agent"]["image"] == "reg.example/verifier:1"
        assert resolved["vllm"]["image"] == "verifier-vllm:local"
        assert resolved["agent"]["pid"] == resolved["vllm"]["pid"] == "service:pidns"
        assert resolved["pidns"]["init"] is True


def test_compose_config_rejects_a_broken_copy(clis: list[list[str]], tmp_path: Path) -> None:
    """Negative control: the same check refuses a misspelled service key."""
    shutil.copy(POLICY, tmp_path / "policy.toml")
    broken = tmp_path / "compose.yaml"
    text = COMPOSE.read_text()
    assert "    cap_add:\n" in text
    broken.write_text(text.replace("    cap_add:\n", "    cap_addd:\n"))
    for cli in clis:
        out = _run_compose(cli, broken, "config", "-q")
        assert out.returncode != 0, f"{shlex.join(cli)} accepted cap_addd"
        assert "cap_addd" in out.stderr + out.stdout


# --- the healthchecks work ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def healthcheck(compose: Doc, service: str, replace: str, by: str) -> list[str]:
    """SERVICE's healthcheck as a command for this machine: the venv's Python for python3, and
    its address REPLACE changed to BY."""
    test = compose["services"][service]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"], test
    assert replace in test[3]
    return [sys.executable, "-c", test[3].replace(replace, by)]


def passes(cmd: list[str], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while True:
        if subprocess.run(cmd, check=False, capture_output=True, timeout=30).returncode == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)


@pytest.fixture
def started() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        exe = VENV_BIN / "verifier"
        p = subprocess.Popen(
            [str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_verifier_and_agent_healthchecks(
    compose: Doc, tmp_path: Path, started: Callable[..., subprocess.Popen[bytes]]
) -> None:
    api, vhealth, health = free_port(), free_port(), free_port()
    check_verifier = healthcheck(compose, "verifier", "127.0.0.1:50553", f"127.0.0.1:{vhealth}")
    check_agent = healthcheck(compose, "agent", "127.0.0.1:50552", f"127.0.0.1:{health}")
    assert not passes(check_verifier, 0), "healthy with nothing listening"
    assert not passes(check_agent, 0), "healthy with nothing listening"

    # As in the stack: mTLS on the API port, the health service alone in plaintext beside it.
    pki = tmp_path / "pki"
    for args in (["init", "--dir", str(pki)],
                 ["issue", "verifier", "--dir", str(pki), "--ip", "127.0.0.1"],
                 ["issue", "agent-h", "--dir", str(pki), "--target", "healthcheck"]):  # fmt: skip
        assert subprocess.run([str(VENV_BIN / "verifier"), "certs", *args], check=False,
                              capture_output=True).returncode == 0  # fmt: skip
    started("serve", "--listen", f"127.0.0.1:{api}", "--db", str(tmp_path / "v.sqlite3"),
            "--tls-cert", str(pki / "verifier.pem"), "--tls-key", str(pki / "verifier.key"),
            "--tls-client-ca", str(pki / "ca.pem"),
            "--health-listen", f"127.0.0.1:{vhealth}")  # fmt: skip
    assert passes(check_verifier, 30), "the verifier's healthcheck never passed"
    api_check = healthcheck(compose, "verifier", "127.0.0.1:50553", f"127.0.0.1:{api}")
    assert not passes(api_check, 0), "the API port answered a client without a certificate"
    # the agent reports on one idle process only (--pid): nothing of this machine is scanned
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started(
            "agent",
            "--verifier",
            f"127.0.0.1:{api}",
            "--target",
            "healthcheck",
            "--agent-id",
            "agent-h",
            "--tls-ca",
            str(pki / "ca.pem"),
            "--tls-cert",
            str(pki / "agent-h.pem"),
            "--tls-key",
            str(pki / "agent-h.key"),
            "--pid",
            str(idle.pid),
            "--spool",
            str(tmp_path / "spool"),
            "--health",
            f"127.0.0.1:{health}",
        )
        assert passes(check_agent, 30), "the agent's healthcheck never passed"
    finally:
        idle.kill()
        idle.wait()


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_vllm_healthcheck(compose: Doc) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        check = healthcheck(compose, "vllm", "127.0.0.1:8000", f"127.0.0.1:{port}")
        assert passes(check, 0)
        _Health.status = 503  # vLLM answers this while the engine is not up
        assert not passes(check, 0)
    finally:
        _Health.status = 200
        server.shutdown()
        server.server_close()


# --- mutual TLS in both stacks (issue 19 item 2) ----------------------------------------------


def _secret_mounts(pod: Doc, c: Doc) -> dict[str, str]:
    """mount path -> Secret name, for the Secret volumes container C mounts."""
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {m["mountPath"]: secrets[m["name"]] for m in c["volumeMounts"] if m["name"] in secrets}


def _under(path: str, mounts: dict[str, str]) -> str:
    """The Secret whose mount holds PATH."""
    (found,) = [s for at, s in mounts.items() if str(PurePosixPath(path).parent) == at]
    return found


def test_no_stack_runs_insecure_or_accepts_unauthenticated_evidence(
    k8s_docs: list[Doc], compose: Doc
) -> None:
    texts = [p.read_text() for p in [*k8s_files(), COMPOSE, POLICY]]
    for text in texts:
        assert "--insecure" not in text
        assert "unsafe_allow_unauthenticated = true" not in text
    for policy in (POLICY.read_text(), _configmap_policy(k8s_docs)):
        assert not [k for k in tomllib.loads(policy).get("evidence", {}) if k.startswith("unsafe_")]
    for svc in compose["services"].values():
        assert "--insecure" not in (svc.get("command") or [])


def test_k8s_verifier_and_agent_speak_mtls_with_keys_from_secrets(k8s_docs: list[Doc]) -> None:
    vpod = one(k8s_docs, "Deployment", "verifier")["spec"]["template"]["spec"]
    verifier = container(vpod, "verifier")
    vmounts = _secret_mounts(vpod, verifier)
    server = {f: _under(flag(verifier["args"], f), vmounts)
              for f in ("--tls-cert", "--tls-key", "--tls-client-ca")}  # fmt: skip
    assert set(server.values()) == {"verifier-tls"}, server
    pod = _vllm_pod(k8s_docs)
    agent = container(pod, "agent")
    amounts = _secret_mounts(pod, agent)
    client = {f: _under(flag(agent["args"], f), amounts)
              for f in ("--tls-ca", "--tls-cert", "--tls-key")}  # fmt: skip
    assert set(client.values()) == {"verifier-agent-tls"}, client
    assert flag(agent["args"], "--agent-id") == "agent-vllm"
    # vLLM's own container never mounts the agent's key
    assert "verifier-agent-tls" not in _secret_mounts(pod, container(pod, "vllm")).values()
    # keys readable by their owner (the agent: root) or, for the non-root verifier, by the
    # pod's fsGroup too; never by anyone else
    for v in pod["volumes"]:
        if "secret" in v:
            assert v["secret"]["defaultMode"] == 0o400
    for v in vpod["volumes"]:
        if "secret" in v:
            assert v["secret"]["defaultMode"] == 0o440
    assert vpod["securityContext"]["fsGroup"] == vpod["securityContext"]["runAsUser"]


def test_cert_manager_example_issues_what_the_manifests_mount(k8s_docs: list[Doc]) -> None:
    docs = load_docs(CERT_MANAGER)
    assert {d["apiVersion"] for d in docs} == {"cert-manager.io/v1"}
    certs = {d["spec"]["secretName"]: d for d in docs if d["kind"] == "Certificate"}
    mounted = {
        v["secret"]["secretName"]
        for d in k8s_docs
        if d["kind"] == "Deployment"
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert mounted <= set(certs), mounted - set(certs)
    agent = container(_vllm_pod(k8s_docs), "agent")
    a = certs["verifier-agent-tls"]["spec"]
    assert a["commonName"] == flag(agent["args"], "--agent-id")
    assert a["uris"] == [f"verifier:target:{flag(agent['args'], '--target')}"]
    assert "verifier" in certs["verifier-tls"]["spec"]["dnsNames"]  # the Service's name
    assert certs["verifier-harness-tls"]["spec"]["uris"] == ["verifier:role:harness"]
    assert all("namespace" not in d["metadata"] for d in docs)


def test_compose_stack_speaks_mtls_with_certs_made_once(compose: Doc) -> None:
    s = compose["services"]
    certs = s["certs"]
    script = certs["command"][0]
    ca_volume = [v for v in certs["volumes"] if v.endswith(":/pki/ca")]
    assert len(ca_volume) == 1
    ca_name = ca_volume[0].split(":")[0]
    for name in ("verifier", "agent"):  # the CA's key is mounted by the certs service only
        assert not [v for v in s[name]["volumes"] if v.split(":")[0] == ca_name]
    cmd = s["verifier"]["command"]
    assert "--tls-client-ca" in cmd and "--tls-cert" in cmd and "--tls-key" in cmd
    agent = s["agent"]["command"]
    agent_id = flag(agent, "--agent-id")
    assert f"issue {agent_id} " in script and f"--target {flag(agent, '--target')}" in script
    for f in ("--tls-ca", "--tls-cert", "--tls-key"):
        at = str(PurePosixPath(flag(agent, f)).parent)
        assert [v for v in s["agent"]["volumes"] if v.split(":")[1] == at and v.endswith(":ro")]
    for name in ("verifier", "agent"):
        assert s[name]["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert "[ -f" in script  # made once: a restart does not re-key
