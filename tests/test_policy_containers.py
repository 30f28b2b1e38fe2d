"""[targets.containers]: evidence must come from the container a target is bound to, and what
the agent could not observe keeps a target from passing. Unit tests over the policy engine;
tests/test_containers_live.py runs the same rules against real containers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from servewitness.agent.config import AgentConfig
from servewitness.agent.containers import (
    POD_LABELS_ENV,
    POD_NAME_ENV,
    POD_NAMESPACE_ENV,
    POD_UID_ENV,
    ContainerDirectory,
    OwnPod,
    parse_downward_labels,
)
from servewitness.agent.runner import Agent
from servewitness.evidence.container import container_of
from servewitness.evidence.procfs import ProcFS
from servewitness.model import ContainerInfo, ProcessReport, Severity, TargetVerdict, Verdict
from servewitness.policy import PolicyError, TargetSnapshot
from tests.test_policy_engine import HOOK_V1, NOW, api, engine, policy, snap, worker

SERVING = "5" * 64
IDLE = "1" * 64
COMPOSE = (("com.docker.compose.service", "vllm"),)


def in_container(cid: str | None) -> tuple[ProcessReport, ...]:
    return tuple(replace(p, container_id=cid) for p in (api(), engine(), worker()))


def named(cid: str, name: str, labels: tuple[tuple[str, str], ...] = ()) -> ContainerInfo:
    return ContainerInfo(cid, "docker", "cgroup", name=name, labels=labels)


def judge(binding: str, s: TargetSnapshot) -> TargetVerdict:
    body = f'[targets]\nnames = ["serving-0"]\n[targets.containers]\nserving-0 = "{binding}"\n'
    return policy(body + HOOK_V1).evaluate_target(s, NOW)


def ids(v: TargetVerdict) -> set[str]:
    return {f.id for f in v.findings if f.severity != Severity.INFO}


@pytest.mark.parametrize(
    "binding",
    [SERVING[:12], SERVING, "vllm-serving", "label:com.docker.compose.service=vllm"],
)
def test_evidence_from_the_bound_container_passes(binding: str) -> None:
    s = replace(snap(*in_container(SERVING)), containers=(named(SERVING, "vllm-serving", COMPOSE),))
    v = judge(binding, s)
    assert (v.verdict, ids(v)) == (Verdict.PASS, set())


@pytest.mark.parametrize(
    "binding",
    [SERVING[:12], "vllm-serving", "label:com.docker.compose.service=vllm"],
)
def test_evidence_from_another_container_fails_whatever_it_says(binding: str) -> None:
    # The idle container's processes are healthy in every other respect.
    s = replace(snap(*in_container(IDLE)), containers=(named(IDLE, "vllm-idle"),))
    v = judge(binding, s)
    assert v.verdict == Verdict.FAIL and ids(v) == {"evidence.container_mismatch"}
    bad = [f for f in v.findings if f.id == "evidence.container_mismatch"]
    assert len(bad) == 3  # one per process
    assert bad[0].context["container_id"] == IDLE and bad[0].context["expected"] == binding
    assert "vllm-idle" in bad[0].message


def test_a_host_process_never_satisfies_a_binding() -> None:
    v = judge(SERVING[:12], snap(*in_container(None)))
    assert v.verdict == Verdict.FAIL and ids(v) == {"evidence.container_mismatch"}
    assert "no container" in v.findings[0].message


def test_one_process_elsewhere_is_enough_to_fail() -> None:
    procs = (*in_container(SERVING)[:2], replace(worker(), container_id=IDLE))
    v = judge(SERVING[:12], snap(*procs))
    assert v.verdict == Verdict.FAIL
    (bad,) = [f for f in v.findings if f.id == "evidence.container_mismatch"]
    assert bad.context["role"] == "worker"


def test_name_binding_without_docker_api_is_pending_with_the_reason() -> None:
    info = ContainerInfo(SERVING, "docker", "cgroup", docker_error="no socket at /x.sock")
    v = judge("vllm-serving", replace(snap(*in_container(SERVING)), containers=(info,)))
    assert v.verdict == Verdict.PENDING and ids(v) == {"evidence.container_unknown"}
    assert all("no socket at /x.sock" in f.message for f in v.findings if f.id.endswith("unknown"))
    # An id binding needs no Docker API: it is checked from the cgroup alone.
    assert judge(SERVING[:16], replace(snap(*in_container(SERVING)), containers=(info,))).verdict \
        == Verdict.PASS  # fmt: skip


def test_unbound_targets_are_not_judged_by_container() -> None:
    v = policy(HOOK_V1).evaluate_target(snap(*in_container(IDLE)), NOW)
    assert v.verdict == Verdict.PASS


def test_what_the_agent_could_not_observe_keeps_the_target_pending() -> None:
    why = "no vLLM process in this PID namespace"
    v = policy(HOOK_V1).evaluate_target(replace(snap(), unobservable=(why,)), NOW)
    assert v.verdict == Verdict.PENDING
    assert {"evidence.unobservable", "evidence.no_processes"} <= ids(v)
    # ... also when the processes it did see are healthy
    v = policy(HOOK_V1).evaluate_target(
        replace(snap(*in_container(None)), unobservable=(why,)), NOW
    )
    assert v.verdict == Verdict.PENDING and ids(v) == {"evidence.unobservable"}


@pytest.mark.parametrize(
    ("body", "what"),
    [
        ('[targets.containers]\nx = "label:nokey"\n', "label:KEY=VALUE"),
        ('[targets.containers]\nx = "has space"\n', "not a container name"),
        ('[targets.containers]\nx = ""\n', "must not be empty"),
        ("[targets.containers]\nx = 3\n", "must be a string"),
        ("[targets.containers]\n", "must not be empty"),
        ('[targets]\nnames = ["a"]\n[targets.containers]\nb = "vllm"\n', "do not list"),
    ],
)
def test_malformed_bindings_are_rejected_with_the_key(body: str, what: str) -> None:
    with pytest.raises(PolicyError, match=what) as e:
        policy(body + HOOK_V1)
    assert "targets" in str(e.value)


# ------------------------------------------------ STALE: where the evidence last came from


def test_stale_evidence_names_its_container_and_says_it_may_have_exited() -> None:
    info = replace(named(SERVING, "vllm-serving", COMPOSE), restart_count=2)
    s = replace(snap(*in_container(SERVING)), containers=(info,))
    v = policy(HOOK_V1).evaluate_target(s, NOW + 60)  # default freshness is 10 s
    assert v.verdict == Verdict.STALE
    (stale,) = [f for f in v.findings if f.id == "evidence.stale"]
    assert stale.severity == Severity.PENDING
    assert f"container {SERVING[:12]} (vllm-serving)" in stale.message
    assert "may have exited or restarted" in stale.message
    assert "62.0 s old" in stale.message and "freshness_s 10" in stale.message
    assert stale.context["containers"] == [
        {"container_id": SERVING, "name": "vllm-serving", "pod": None, "restart_count": 2}
    ]
    assert stale.context["age_s"] == 62.0 and stale.context["freshness_s"] == 10.0
    # Control: the same evidence while fresh has no such finding.
    fresh = policy(HOOK_V1).evaluate_target(s, NOW)
    assert fresh.verdict == Verdict.PASS and "evidence.stale" not in ids(fresh)


def test_stale_evidence_names_the_container_without_docker_and_the_pod_in_kubernetes() -> None:
    s = snap(*in_container(SERVING))  # only the cgroup's id: no ContainerInfo at all
    (stale,) = [f for f in policy(HOOK_V1).evaluate_target(s, NOW + 60).findings
                if f.id == "evidence.stale"]  # fmt: skip
    assert f"container {SERVING[:12]}," in stale.message and "exited or restarted" in stale.message
    pod = ContainerInfo(SERVING, "containerd", "cgroup", labels=POD_LABELS)
    (stale,) = [f for f in policy(HOOK_V1).evaluate_target(replace(s, containers=(pod,)),
                NOW + 60).findings if f.id == "evidence.stale"]  # fmt: skip
    assert f"container {SERVING[:12]} (pod serving/vllm-7d9f)" in stale.message


def test_stale_evidence_outside_containers_says_so() -> None:
    (stale,) = [f for f in policy(HOOK_V1).evaluate_target(snap(*in_container(None)),
                NOW + 60).findings if f.id == "evidence.stale"]  # fmt: skip
    assert "in no container the agent could name (pid 100, 200, 300)" in stale.message
    assert "exited" in stale.message and stale.context["containers"] == []
    (stale,) = [f for f in policy(HOOK_V1).evaluate_target(snap(), NOW + 60).findings
                if f.id == "evidence.stale"]  # fmt: skip
    assert "it showed no vLLM process" in stale.message


# ------------------------------------------- Kubernetes: a label binding over the agent's pod

POD_UID = "b46ffd44-9487-47bc-b9c4-27ecc08ac3de"
OTHER_POD = "0e0ad2b4-7a1d-4f5b-9a8e-1c2d3e4f5a6b"
POD_LABELS = (
    ("app.kubernetes.io/name", "vllm"),
    ("io.kubernetes.pod.name", "vllm-7d9f"),
    ("io.kubernetes.pod.namespace", "serving"),
    ("io.kubernetes.pod.uid", POD_UID),
)
K8S_BINDING = "label:app.kubernetes.io/name=vllm"


def test_pod_labels_without_a_name_decide_a_label_binding() -> None:
    no_docker = "the agent was started without a Docker API socket"
    info = ContainerInfo(SERVING, "containerd", "cgroup", labels=POD_LABELS, docker_error=no_docker)
    s = replace(snap(*in_container(SERVING)), containers=(info,))
    assert judge(K8S_BINDING, s).verdict == Verdict.PASS
    v = judge("label:app.kubernetes.io/name=other", s)
    assert v.verdict == Verdict.FAIL and ids(v) == {"evidence.container_mismatch"}
    assert "(pod serving/vllm-7d9f)" in v.findings[0].message
    # A name binding cannot be told from pod labels: PENDING with the reason, not FAIL.
    v = judge("vllm-serving", s)
    assert v.verdict == Verdict.PENDING and ids(v) == {"evidence.container_unknown"}
    # Control: no labels and no name, the label binding cannot be told either.
    bare = replace(info, labels=())
    assert judge(K8S_BINDING, replace(s, containers=(bare,))).verdict == Verdict.PENDING


# The agent's side, over /proc trees as a sidecar reads them (cgroup v2, containerd's systemd
# driver, a private cgroup namespace: the agent's own cgroup reads "/", a container beside it
# "/../<scope>", one of another pod "/../../<pod slice>/<scope>").
VLLM_CID = "7" * 64
BESIDE = f"0::/../cri-containerd-{VLLM_CID}.scope\n"
OTHER_POD_CG = (
    f"0::/../../kubepods-besteffort-pod{OTHER_POD.replace('-', '_')}.slice/"
    f"cri-containerd-{VLLM_CID}.scope\n"
)
HOST_NS_CG = f"0::/kubepods.slice/kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{VLLM_CID}.scope\n"  # noqa: E501
LABELS_FILE = 'app.kubernetes.io/name="vllm"\npod-template-hash="7d9f"\n'


def proc_tree(root: Path, process_cgroup: str, own_cgroup: str = "0::/\n") -> ProcFS:
    (root / "self").mkdir(parents=True)
    (root / "self" / "cgroup").write_text(own_cgroup)
    (root / "42").mkdir()
    (root / "42" / "cgroup").write_text(process_cgroup)
    return ProcFS(root)


def own_pod(tmp: Path, labels: str | None = LABELS_FILE) -> OwnPod:
    env = {POD_UID_ENV: POD_UID, POD_NAME_ENV: "vllm-7d9f", POD_NAMESPACE_ENV: "serving"}
    if labels is not None:
        (tmp / "labels").write_text(labels)
        env[POD_LABELS_ENV] = str(tmp / "labels")
    pod = OwnPod.from_env(env)
    assert pod is not None
    return pod


def describe(tmp: Path, cgroup: str, pod: OwnPod | None, own: str = "0::/\n") -> ContainerInfo:
    procfs = proc_tree(tmp / "proc", cgroup, own)
    ref = container_of(procfs, 42)
    assert ref is not None and ref.id == VLLM_CID
    (info,) = ContainerDirectory(None, pod, procfs).describe([ref], {ref.id: 42})
    return info


def test_the_agent_names_a_container_of_its_own_pod_by_the_pods_labels(tmp_path: Path) -> None:
    info = describe(tmp_path, BESIDE, own_pod(tmp_path))
    assert info.name is None and info.pod_uid is None  # the cgroup names no pod...
    assert dict(info.labels) == {  # ...but it sits beside the agent's own container
        "app.kubernetes.io/name": "vllm",
        "pod-template-hash": "7d9f",
        "io.kubernetes.pod.uid": POD_UID,
        "io.kubernetes.pod.name": "vllm-7d9f",
        "io.kubernetes.pod.namespace": "serving",
    }
    assert info.docker_error == "the agent was started without a Docker API socket"
    # With the host's cgroup namespace the pod uid is in the path: that is checked instead.
    (tmp_path / "h").mkdir()
    info = describe(tmp_path / "h", HOST_NS_CG, own_pod(tmp_path), own="0::/elsewhere\n")
    assert info.pod_uid == POD_UID and info.label("app.kubernetes.io/name") == "vllm"


@pytest.mark.parametrize(
    ("cgroup", "own", "why"),
    [
        # a hostPID agent reading a process of another pod
        (OTHER_POD_CG, "0::/\n", f"runs in pod {OTHER_POD}, not in the agent's pod {POD_UID}"),
        # a process of a plain Docker container on the node: no pod, not beside the agent
        (f"0::/../../system.slice/docker-{VLLM_CID}.scope\n", "0::/\n", "not beside"),
        # crun's payload sub-cgroup is one level deeper: not placed, never guessed
        (f"0::/../crio-{VLLM_CID}.scope/container\n", "0::/\n", "not beside"),
    ],
)
def test_a_container_outside_the_agents_pod_gets_no_labels_and_the_reason(
    tmp_path: Path, cgroup: str, own: str, why: str
) -> None:
    info = describe(tmp_path, cgroup, own_pod(tmp_path), own)
    assert info.labels == () and why in (info.docker_error or "")
    s = replace(snap(*in_container(VLLM_CID)), containers=(info,))
    v = judge(K8S_BINDING, s)
    assert v.verdict == Verdict.PENDING and ids(v) == {"evidence.container_unknown"}
    assert why in v.findings[0].message


def test_without_its_own_pod_or_with_a_bad_labels_file_the_agent_says_why(tmp_path: Path) -> None:
    cg = (
        f"0::/../../kubepods-pod{POD_UID.replace('-', '_')}.slice/cri-containerd-{VLLM_CID}.scope\n"
    )
    info = describe(tmp_path, cg, None)
    assert info.labels == () and POD_UID_ENV in (info.docker_error or "")
    assert f"pod {POD_UID}" in (info.docker_error or "")
    (tmp_path / "b").mkdir()
    info = describe(tmp_path / "b", BESIDE, own_pod(tmp_path / "b", 'app="x"\nnot a label\n'))
    assert info.labels == () and "are unreadable" in (info.docker_error or "")
    assert "line 2" in (info.docker_error or "")


def test_the_downward_api_fields_win_over_pod_labels_of_the_same_key(tmp_path: Path) -> None:
    forged = LABELS_FILE + 'io.kubernetes.pod.namespace="prod"\n'
    info = describe(tmp_path, BESIDE, own_pod(tmp_path, forged))
    assert info.label("io.kubernetes.pod.namespace") == "serving"


def test_parse_downward_labels() -> None:
    assert parse_downward_labels('a="1"\nb.io/c="x-y_z.0"\n') == {"a": "1", "b.io/c": "x-y_z.0"}
    assert parse_downward_labels("") == {}
    for bad in ("a=1\n", 'a="1" b="2"\n', 'a="has space"\n', '="x"\n'):
        with pytest.raises(ValueError, match="line 1"):
            parse_downward_labels(bad)


def _vllm_pod_tree(root: Path, cgroup: str) -> None:
    """A /proc the real agent collects from: one readable vLLM API server (no probe) in a
    container whose cgroup is CGROUP, and the agent's own cgroup at the namespace's root."""
    (root / "stat").parent.mkdir(parents=True)
    (root / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    (root / "self").mkdir()
    (root / "self" / "cgroup").write_text("0::/\n")
    d = root / "100"
    d.mkdir()
    rest = ["S", "1"] + ["0"] * 17 + ["1100"] + ["0"] * 30
    (d / "stat").write_bytes(b"100 (python3) " + " ".join(rest).encode())
    (d / "status").write_text("Name:\tpython3\nNSpid:\t100\n")
    (d / "cmdline").write_bytes(b"python3\0-m\0vllm.entrypoints.openai.api_server\0")
    (d / "environ").write_bytes(b"PATH=/usr/bin\0")
    (d / "maps").write_text("")
    (d / "cgroup").write_text(cgroup)
    (d / "exe").symlink_to("/usr/bin/python3.11")


@pytest.mark.parametrize(("labels", "want"), [(LABELS_FILE, None), ('app="debug-copy"\n', "mis")])
def test_agent_in_a_pod_reports_its_pods_labels_and_the_binding_judges_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, labels: str, want: str | None
) -> None:
    """The real agent, told its pod through the downward API's environment: the serving pod's
    labels satisfy the binding; a sidecar in a pod without them (a debug copy, another
    Deployment) reporting as the same target FAILs on it, as an idle container does with
    Docker."""
    _vllm_pod_tree(tmp_path / "proc", BESIDE)
    (tmp_path / "labels").write_text(labels)
    monkeypatch.setenv(POD_UID_ENV, POD_UID)
    monkeypatch.setenv(POD_NAME_ENV, "vllm-7d9f")
    monkeypatch.setenv(POD_NAMESPACE_ENV, "serving")
    monkeypatch.setenv(POD_LABELS_ENV, str(tmp_path / "labels"))
    cfg = AgentConfig("unix:/nonexistent", "vllm", "t", tmp_path / "spool",
                      proc_root=str(tmp_path / "proc"), docker_socket=None)  # fmt: skip
    agent = Agent(cfg)
    try:
        report = agent.collect()
    finally:
        agent.channel.close()
    (info,) = report.containers
    assert [p.container_id for p in report.processes] == [VLLM_CID] == [info.id]
    assert info.label("io.kubernetes.pod.uid") == POD_UID
    s = TargetSnapshot("vllm", report.processes, NOW, (VLLM_CID,), 0.0, report.containers)
    body = f'[targets]\nnames = ["vllm"]\n[targets.containers]\nvllm = "{K8S_BINDING}"\n'
    found = {f.id for f in policy(body + HOOK_V1).evaluate_target(s, NOW).findings}
    if want is None:
        assert not {"evidence.container_mismatch", "evidence.container_unknown"} & found
    else:
        assert "evidence.container_mismatch" in found
