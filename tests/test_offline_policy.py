"""Offline targets (vllm.LLM in a script, a direct executor driver) under ``require_probe``:
no API server is never a silent pass where the policy asks for one, and a policy that names
the roles offline use has can pass. (The same against real vLLM: test_offline_live.py.)"""

from __future__ import annotations

import dataclasses

from servewitness.model import ProcessReport, Verdict
from servewitness.policy import findings as F
from tests.test_policy_engine import HOOK_V1, api, engine, ids, judge, proc, worker


def offline(pid: int = 50) -> ProcessReport:
    return proc(pid, "offline", files=())


def evidence(roles: str) -> str:
    return f"[evidence]\nrequire_probe = [{roles}]\n{HOOK_V1}"


def test_offline_front_end_under_the_default_policy_is_pending_for_want_of_an_api_server() -> None:
    v = judge(HOOK_V1, offline(), engine(), worker())
    assert v.verdict == Verdict.PENDING
    assert ids(v) == [F.EVIDENCE_ROLE_MISSING]
    (f,) = [f for f in v.findings if f.id == F.EVIDENCE_ROLE_MISSING]
    assert f.context["role"] == "api_server" and "offline" in f.message
    assert f.context["roles_present"] == ["engine_core", "offline", "worker"]


def test_policy_naming_api_server_holds_any_target_without_one_pending() -> None:
    v = judge(evidence('"api_server", "worker"'), worker())
    assert v.verdict == Verdict.PENDING and ids(v) == [F.EVIDENCE_ROLE_MISSING]


def test_policy_naming_the_offline_roles_passes_offline_use() -> None:
    layouts = [(offline(), engine(), worker()), (worker(),)]
    for procs in layouts:
        v = judge(evidence('"offline", "engine_core", "worker"'), *procs)
        assert v.verdict == Verdict.PASS, ids(v)


def test_a_server_target_is_unchanged() -> None:
    assert judge(HOOK_V1, api(), engine(), worker()).verdict == Verdict.PASS
    explicit = judge(evidence('"api_server", "engine_core", "worker"'), api(), engine(), worker())
    assert explicit.verdict == Verdict.PASS


def test_offline_front_end_without_a_probe_fails_when_its_role_is_required() -> None:
    v = judge(
        evidence('"offline", "worker"'),
        proc(50, "offline", probe=False),
        engine(),
        worker(),
    )
    assert v.verdict == Verdict.FAIL and F.EVIDENCE_PROBE_ABSENT in ids(v)


def one_process() -> ProcessReport:
    """Offline use in one process: front end, engine core and worker, reported as a worker
    with every role it plays."""
    return dataclasses.replace(worker(), roles=("engine_core", "offline", "worker"))


def test_one_process_offline_under_the_default_policy_is_pending_like_the_multi_process_one() -> (
    None
):
    v = judge(HOOK_V1, one_process())
    assert v.verdict == Verdict.PENDING
    assert ids(v) == [F.EVIDENCE_ROLE_MISSING]
    (f,) = [f for f in v.findings if f.id == F.EVIDENCE_ROLE_MISSING]
    assert f.context["roles_present"] == ["engine_core", "offline", "worker"]
    assert "offline" in f.message


def test_a_server_whose_api_server_is_out_of_view_still_passes_under_the_default() -> None:
    # the control for the test above: the same worker without the offline role (an agent
    # that sees the engine core and worker only) is not held for an API server
    assert judge(HOOK_V1, engine(), worker()).verdict == Verdict.PASS
    plain = dataclasses.replace(worker(), roles=("worker",))
    assert judge(HOOK_V1, plain).verdict == Verdict.PASS


def test_one_process_offline_passes_a_policy_naming_its_roles_and_counts_as_each() -> None:
    v = judge(evidence('"offline", "engine_core", "worker"'), one_process())
    assert v.verdict == Verdict.PASS, ids(v)
    # a hook judged on the engine core finds the one process that is the engine core
    on_engine = '[evidence]\nrequire_probe = ["worker"]\n' + HOOK_V1.replace(
        'name = "v1_step"', 'name = "v1_step"\nrole = "engine_core"'
    )
    assert "engine_core" in on_engine
    assert judge(on_engine, one_process()).verdict == Verdict.PASS
    assert judge(on_engine, worker()).verdict == Verdict.PENDING  # no engine core at all
