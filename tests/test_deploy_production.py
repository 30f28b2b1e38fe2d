"""deploy/k8s/production: the production overlay, offline.

It adds objects to the base (a Namespace, NetworkPolicies, a ServiceMonitor) and sets their
namespace; it patches nothing, so rendering it is reading its files (``render``) and the
checks here see what `kubectl apply -k` would apply. Checked:

- every object validates against the Kubernetes schemas (strict), the ServiceMonitor against
  the fields it uses (the Prometheus Operator's CRD has no bundled schema);
- Pod Security: the verifier's pod meets "restricted", the vLLM pod "baseline" but for the
  agent's one capability (SYS_PTRACE), by the standard's rules (``violations``), each rule
  with a negative control;
- the NetworkPolicies let through exactly what must talk: agents to the verifier's gRPC port,
  clients to the verifier and to vLLM's API, the monitoring namespace to the metrics ports,
  DNS; nothing else, in either direction (``allowed``: the policies' semantics for the
  selectors they use);
- the ServiceMonitor scrapes ports that exist, on Services it selects, where the containers
  serve metrics.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO
from tests.test_deploy_manifests import container, flag, one, port_of, validate_k8s

PROD = REPO / "deploy" / "k8s" / "production"
BASE = REPO / "deploy" / "k8s" / "base"

Doc = dict[str, Any]


def load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def render(kustomization: Path = PROD / "kustomization.yaml") -> list[Doc]:
    """What `kubectl kustomize` makes of an overlay that only lists resources and sets a
    namespace (what the production overlay is; anything more is refused here)."""
    kust = yaml.safe_load(kustomization.read_text())
    assert set(kust) <= {"apiVersion", "kind", "namespace", "resources"}, sorted(kust)
    docs = resources(kustomization, kust["resources"])
    if "namespace" in kust:
        for d in docs:
            if d["kind"] != "Namespace":
                d.setdefault("metadata", {})["namespace"] = kust["namespace"]
    return docs


def resources(kustomization: Path, listed: list[str]) -> list[Doc]:
    """The objects of LISTED, the resources of KUSTOMIZATION: files read, folders rendered."""
    docs: list[Doc] = []
    for res in listed:
        path = kustomization.parent / res
        docs += render(path / "kustomization.yaml") if path.is_dir() else load(path)
    return docs


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render()


def pod_of(docs: list[Doc], name: str) -> Doc:
    spec: Doc = one(docs, "Deployment", name)["spec"]["template"]["spec"]
    return spec


# --- what it is made of -----------------------------------------------------------------------


def test_the_overlay_adds_its_files_to_the_base_and_patches_nothing(docs: list[Doc]) -> None:
    kust = yaml.safe_load((PROD / "kustomization.yaml").read_text())
    own = sorted(p.name for p in PROD.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(r for r in kust["resources"] if r != "../base") == own
    assert "../base" in kust["resources"]
    assert kust["namespace"] == "servewitness"
    base = render(BASE / "kustomization.yaml")
    key = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(key) == len(set(key)), "an object twice"
    assert {(d["kind"], d["metadata"]["name"]) for d in base} <= set(key)
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "servewitness", d["metadata"]
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    assert ns["metadata"]["name"] == kust["namespace"]


def test_every_object_validates(docs: list[Doc]) -> None:
    for d in docs:
        if d["apiVersion"] == "monitoring.coreos.com/v1":
            continue  # no bundled schema: test_service_monitor_scrapes_what_is_served
        validate_k8s(d)


def test_the_namespace_enforces_what_the_agent_needs_and_warns_on_more(docs: list[Doc]) -> None:
    (ns,) = [d for d in docs if d["kind"] == "Namespace"]
    labels = ns["metadata"]["labels"]
    prefix = "pod-security.kubernetes.io/"
    # SYS_PTRACE is beyond "baseline": enforcing more would refuse the agent
    assert labels[prefix + "enforce"] == "privileged"
    assert labels[prefix + "warn"] == labels[prefix + "audit"] == "restricted"


# --- Pod Security Standards (Kubernetes 1.30), the rules these pods could break ---------------

BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL",
                 "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID",
                 "SYS_CHROOT"}  # fmt: skip
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def violations(pod: Doc, level: str) -> list[str]:
    """What of POD (a pod spec) breaks Pod Security LEVEL ("baseline" or "restricted")."""
    out: list[str] = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"pod uses {key}")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if "hostPath" in kinds:
            out.append(f"volume {v['name']} is a hostPath")
        elif level == "restricted" and not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} is of type {sorted(kinds)}")
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        out += _container_violations(c, pod.get("securityContext", {}), level)
    return out


def _container_violations(c: Doc, psc: Doc, level: str) -> list[str]:
    """What of container C (its pod's security context PSC) breaks Pod Security LEVEL."""
    out: list[str] = []
    sc = c.get("securityContext", {})
    where = f"container {c['name']}"
    caps = sc.get("capabilities", {})
    allowed = BASELINE_CAPS if level == "baseline" else {"NET_BIND_SERVICE"}
    out += [f"{where} adds capability {cap}" for cap in caps.get("add", []) if cap not in allowed]
    seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
    broken = {
        "is privileged": bool(sc.get("privileged")),
        "uses a hostPort": any(p.get("hostPort") for p in c.get("ports", [])),
        "unmasks /proc": sc.get("procMount", "Default") != "Default",
        "runs without seccomp": seccomp == "Unconfined",
    }
    if level == "restricted":
        broken |= {
            "sets no seccomp profile": seccomp not in ("RuntimeDefault", "Localhost"),
            "may escalate privileges": sc.get("allowPrivilegeEscalation") is not False,
            "does not drop ALL capabilities": "ALL" not in caps.get("drop", []),
            "may run as root (runAsNonRoot)": not sc.get(
                "runAsNonRoot", psc.get("runAsNonRoot", False)
            ),
            "runs as uid 0": sc.get("runAsUser", psc.get("runAsUser")) == 0,
        }
    return out + [f"{where} {what}" for what, bad in broken.items() if bad]


def test_the_verifier_pod_meets_restricted(docs: list[Doc]) -> None:
    pod = pod_of(docs, "verifier")
    assert violations(pod, "restricted") == []
    sc = container(pod, "verifier")["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True  # beyond the standard: it writes its volumes only


def test_the_vllm_pod_meets_baseline_but_for_the_agents_one_capability(docs: list[Doc]) -> None:
    pod = pod_of(docs, "vllm")
    assert violations(pod, "baseline") == ["container agent adds capability SYS_PTRACE"]
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"


BREAKS: dict[str, tuple[str, str]] = {
    # case: (what is changed, the violation it must give); each on the verifier's pod
    "a capability added": ("cap", "container verifier adds capability SYS_ADMIN"),
    "privilege escalation allowed": ("escalate", "container verifier may escalate privileges"),
    "seccomp profile removed": ("seccomp", "container verifier sets no seccomp profile"),
    "root": ("root", "container verifier runs as uid 0"),
    "runAsNonRoot unset": ("nonroot", "container verifier may run as root (runAsNonRoot)"),
    "a hostPath volume": ("hostpath", "volume host is a hostPath"),
    "the host's PID namespace": ("hostpid", "pod uses hostPID"),
    "capabilities kept": ("keepcaps", "container verifier does not drop ALL capabilities"),
}


def _break(pod: Doc, how: str) -> None:
    sc = container(pod, "verifier")["securityContext"]
    if how == "cap":
        sc["capabilities"]["add"] = ["SYS_ADMIN"]
    elif how == "escalate":
        sc["allowPrivilegeEscalation"] = True
    elif how == "seccomp":
        pod["securityContext"].pop("seccompProfile")
    elif how == "root":
        pod["securityContext"]["runAsUser"] = 0
    elif how == "nonroot":
        pod["securityContext"].pop("runAsNonRoot")
    elif how == "hostpath":
        pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    elif how == "hostpid":
        pod["hostPID"] = True
    elif how == "keepcaps":
        sc["capabilities"]["drop"] = []


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_the_pod_security_check_sees_each_break(docs: list[Doc], case: str) -> None:
    """Negative controls: a copy of the verifier's pod broken one way gives that violation."""
    pod = copy.deepcopy(pod_of(docs, "verifier"))
    how, violation = BREAKS[case]
    _break(pod, how)
    assert violation in violations(pod, "restricted")


# --- NetworkPolicies --------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    labels: dict[str, str]
    ports: dict[str, int]  # named container ports


NAMESPACES = {n: {"kubernetes.io/metadata.name": n}
              for n in ("servewitness", "monitoring", "kube-system", "other")}  # fmt: skip


def _selects(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector not understood here: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer(peer: Doc, policy_ns: str, other: Pod) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, f"peer not understood: {peer}"
    if "namespaceSelector" in peer:
        ns_ok = _selects(peer["namespaceSelector"], NAMESPACES[other.namespace])
    else:
        ns_ok = other.namespace == policy_ns
    return ns_ok and _selects(peer.get("podSelector", {}), other.labels)


def _port(ports: list[Doc] | None, dst: Pod, port: int) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        want = p["port"]
        if (dst.ports.get(want) if isinstance(want, str) else want) == port:
            return True
    return False


def allowed(policies: list[Doc], src: Pod, dst: Pod, port: int) -> bool:
    """Whether POLICIES let SRC open a TCP connection to DST's PORT: the egress policies that
    select SRC (none: any) and the ingress policies that select DST (none: any) must each
    have a rule allowing it."""

    def side(pod: Pod, kind: str, peer: Pod, rules_key: str, peers_key: str) -> bool:
        mine = [p for p in policies if p["metadata"]["namespace"] == pod.namespace
                and kind in p["spec"]["policyTypes"]
                and _selects(p["spec"]["podSelector"], pod.labels)]  # fmt: skip
        if not mine:
            return True
        for p in mine:
            for rule in p["spec"].get(rules_key) or []:
                peers = rule.get(peers_key)
                ns = p["metadata"]["namespace"]
                if (peers is None or any(_peer(x, ns, peer) for x in peers)) and _port(
                    rule.get("ports"), dst, port
                ):
                    return True
        return False

    return side(src, "Egress", dst, "egress", "to") and side(dst, "Ingress", src, "ingress", "from")


def _pod(docs: list[Doc], deployment: str) -> Pod:
    d = one(docs, "Deployment", deployment)
    spec = d["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for c in spec["spec"]["containers"]
             for p in c.get("ports", []) if "name" in p}  # fmt: skip
    return Pod(deployment, d["metadata"]["namespace"], spec["metadata"]["labels"], ports)


@pytest.fixture(scope="module")
def world(docs: list[Doc]) -> dict[str, Pod]:
    return {
        "verifier": _pod(docs, "verifier"),
        "vllm": _pod(docs, "vllm"),
        "client": Pod("client", "servewitness", {"servewitness.io/client": "true"}, {}),
        "stranger": Pod("stranger", "servewitness", {"app": "debug"}, {}),
        "prometheus": Pod("prometheus", "monitoring", {"app": "prometheus"}, {}),
        "outsider": Pod("outsider", "other", {"servewitness.io/client": "true"}, {}),
        "dns": Pod("dns", "kube-system", {"k8s-app": "kube-dns"}, {"dns": 53}),
        "internet": Pod("internet", "other", {}, {}),
    }


# (from, to, port): what must get through; every other pair of WORLD over these ports is denied
MUST = {
    ("vllm", "verifier", 50551),  # the agent reports
    ("client", "verifier", 50551),  # harnesses: wait, exec, windows
    ("client", "vllm", 8000),  # the benchmark's requests
    ("prometheus", "verifier", 9464),
    ("prometheus", "vllm", 9465),
    ("vllm", "dns", 53),
    ("client", "dns", 53),
}
PORTS = (50551, 50553, 8000, 9464, 9465, 53, 443)


def test_network_policies_let_through_exactly_what_must_talk(
    docs: list[Doc], world: dict[str, Pod]
) -> None:
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    got = {(a, b, port) for a in world for b in world if a != b for port in PORTS
           if allowed(policies, world[a], world[b], port)}  # fmt: skip
    # pods outside the namespace are not selected by these policies: what they allow among
    # themselves (prometheus -> dns, ...) is their namespaces' business, not this overlay's
    outside = {"prometheus", "outsider", "dns", "internet"}
    got = {(a, b, p) for a, b, p in got if not (a in outside and b in outside)}
    assert got == MUST, {"unexpected": sorted(got - MUST), "missing": sorted(MUST - got)}


def test_without_the_policies_everything_would_get_through(world: dict[str, Pod]) -> None:
    """Negative control of the evaluator: no policy, no denial."""
    assert allowed([], world["stranger"], world["verifier"], 50551)
    assert allowed([], world["vllm"], world["internet"], 443)


def test_the_verifier_has_no_egress_and_the_vllm_pod_reaches_only_the_verifier_and_dns(
    docs: list[Doc],
) -> None:
    pol = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    assert pol["verifier"]["spec"]["egress"] == []
    assert pol["default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    agent = container(pod_of(docs, "vllm"), "agent")
    assert flag(agent["args"], "--verifier") == "verifier:50551"


# --- metrics ----------------------------------------------------------------------------------


def _services(docs: list[Doc]) -> Iterable[Doc]:
    return (d for d in docs if d["kind"] == "Service")


def test_service_monitor_scrapes_what_is_served(docs: list[Doc]) -> None:
    (sm,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(sm["spec"]) == {"selector", "endpoints"}
    selected = [
        s for s in _services(docs) if _selects(sm["spec"]["selector"], s["metadata"]["labels"])
    ]
    assert {s["metadata"]["name"] for s in selected} == {"verifier", "vllm"}
    for ep in sm["spec"]["endpoints"]:
        assert set(ep) <= {"port", "path", "interval"} and ep["path"] == "/metrics", ep
        owners = [s for s in selected for p in s["spec"]["ports"] if p["name"] == ep["port"]]
        assert len(owners) == 1, ep
        (svc,) = owners
        (sport,) = [p for p in svc["spec"]["ports"] if p["name"] == ep["port"]]
        # the Service's target port is a container port whose container serves metrics there
        pod = pod_of(docs, svc["spec"]["selector"]["app.kubernetes.io/name"])
        (c,) = [c for c in pod["containers"]
                for p in c.get("ports", []) if p.get("name") == sport["targetPort"]]  # fmt: skip
        (cport,) = [p for p in c["ports"] if p.get("name") == sport["targetPort"]]
        assert port_of(flag(c["args"], "--metrics-listen")) == cport["containerPort"], c["name"]
