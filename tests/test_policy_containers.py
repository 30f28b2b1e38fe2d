"""[targets.containers]: evidence must come from the container a target is bound to, and what
the agent could not observe keeps a target from passing. Unit tests over the policy engine;
tests/test_containers_live.py runs the same rules against real containers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.test_policy_engine import HOOK_V1, NOW, api, engine, policy, snap, worker
from verifier.model import ContainerInfo, ProcessReport, Severity, TargetVerdict, Verdict
from verifier.policy import PolicyError, TargetSnapshot

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
        ('[targets]\nnames = ["a"]\n[targets.containers]\nb = "vllm"\n', "does not list"),
    ],
)
def test_malformed_bindings_are_rejected_with_the_key(body: str, what: str) -> None:
    with pytest.raises(PolicyError, match=what) as e:
        policy(body + HOOK_V1)
    assert "targets" in str(e.value)
