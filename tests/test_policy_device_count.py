"""``count = "device"`` in ``[[hooks]]``: a hook judged on its device-side counter, the count
that keeps advancing where a captured CUDA graph replays the hooked code without its Python.
What the counter held right after the first productive step (warm-up, profiling and capture
run the hooked code too) is never credited to the measured steps. And a Python-counted hook
that never fired in a process whose steps ran compiled or as CUDA graphs is told why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servewitness.model import HookEvidence, Severity, Verdict
from servewitness.policy import findings as F
from servewitness.policy import load_policy
from servewitness.policy.interface import PolicyError
from tests.test_policy_engine import hook, ids, judge, only, steps, worker

DEVICE = '[[hooks]]\nname = "fwd"\ncount = "device"\n'
PYTHON = '[[hooks]]\nname = "fwd"\n'


def fwd(**kw: object) -> HookEvidence:
    """A forward hook as seen under CUDA graphs: no Python fire on any step."""
    h = hook("fwd", target="m:Model.forward", how="method", owner="m.Model",
             instantiated="m.Model", fired=0, fired_productive=0)  # fmt: skip
    return replace(h, **kw)  # type: ignore[arg-type]


def graphs() -> object:
    return replace(steps(), compilation_mode="VLLM_COMPILE", cudagraph_mode="FULL_AND_PIECEWISE")


def test_device_count_passes_a_hook_that_python_never_saw_fire() -> None:
    # 8 productive steps; base read after step 1 at 300 (capture ran the forward 299 times)
    h = fwd(device_fired=307, device_base=300, device_base_step=1)
    v = judge(DEVICE, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.PASS, [])
    f = only(v, F.HOOK_FIRING)
    assert {k: f.context[k] for k in ("device_fires_on_steps", "steps_judged", "fired")} == {
        "device_fires_on_steps": 7,
        "steps_judged": 7,
        "fired": 0,
    }
    assert "advanced 7 on the 7 productive steps" in f.message and "300 counted before" in f.message


def test_the_same_evidence_counted_in_python_fails_and_names_the_graph_mode() -> None:
    h = fwd(device_fired=307, device_base=300, device_base_step=1)
    v = judge(PYTHON, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_NOT_FIRING])
    f = only(v, F.HOOK_NOT_FIRING)
    assert f.context["graph_mode"] == "VLLM_COMPILE / FULL_AND_PIECEWISE"
    assert "CUDA graphs" in f.message and 'count = "device"' in f.message


def test_python_hook_that_fired_only_at_capture_fails_outside_steps_only() -> None:
    h = fwd(fired=51, fired_outside=51)
    v = judge(PYTHON, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_OUTSIDE_STEPS_ONLY])
    assert "graph capture" in only(v, F.HOOK_OUTSIDE_STEPS_ONLY).message


def test_eager_steps_add_no_graph_hint() -> None:
    v = judge(PYTHON, worker(hooks=(fwd(),)))
    f = only(v, F.HOOK_NOT_FIRING)
    assert "graph_mode" not in f.context and "CUDA graphs" not in f.message


def test_warm_up_ticks_alone_never_pass() -> None:
    """The counter counted 300 in capture and nothing on the 7 steps after the base: FAIL,
    although 300 > 8 productive steps would pass a count that credited warm-up."""
    h = fwd(device_fired=300, device_base=300, device_base_step=1)
    v = judge(DEVICE, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_NOT_FIRING])
    assert only(v, F.HOOK_NOT_FIRING).context["device_base"] == 300


def test_a_counter_that_fell_behind_fails_fire_ratio_low() -> None:
    h = fwd(device_fired=303, device_base=300, device_base_step=1)  # 3 on 7 steps
    v = judge(DEVICE, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_FIRE_RATIO_LOW])
    assert only(v, F.HOOK_FIRE_RATIO_LOW).context["ratio"] == pytest.approx(3 / 7)


def test_no_device_counter_fails_naming_how_to_declare_one() -> None:
    h = hook("fwd", fired=10, fired_productive=8)  # firing in Python, no counter
    v = judge(DEVICE, worker(hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_NO_DEVICE_COUNTER])
    assert "@device" in only(v, F.HOOK_NO_DEVICE_COUNTER).message


def test_before_the_base_is_read_the_count_is_pending() -> None:
    h = fwd(device_fired=300)  # counter exists, no productive step read yet
    v = judge(DEVICE, worker(step=graphs(), hooks=(h,)))
    assert v.verdict == Verdict.PENDING
    assert ids(v) == [F.STEPS_INSUFFICIENT]


def test_too_few_steps_after_the_base_are_pending() -> None:
    h = fwd(device_fired=310, device_base=300, device_base_step=8)  # 0 steps after it
    v = judge(DEVICE, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.PENDING, [F.STEPS_INSUFFICIENT])


def test_a_hook_whose_module_never_loaded_fails_as_before() -> None:
    h = fwd(module_loaded=False, device_fired=None)
    v = judge(DEVICE, worker(hooks=(h,)))
    assert ids(v) == [F.HOOK_NOT_LOADED]
    assert only(v, F.HOOK_NOT_LOADED).severity == Severity.ERROR


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (DEVICE + 'on = "decode"\n', "cannot be judged on decode steps"),
        ('[[hooks]]\nname = "fwd"\ncount = "tensor"\n', "'tensor' is not one of python, device"),
    ],
)
def test_loader_rejects_counts_it_cannot_judge(body: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        load_policy("version = 1\n" + body, "p.toml")


def test_python_and_device_counts_of_one_hook_are_judged_each() -> None:
    """Both entries for one hook: the device count passes, the Python count fails, and the
    verdict is FAIL with only the Python entry's finding."""
    h = fwd(device_fired=307, device_base=300, device_base_step=1)
    v = judge(DEVICE + PYTHON, worker(step=graphs(), hooks=(h,)))
    assert (v.verdict, ids(v)) == (Verdict.FAIL, [F.HOOK_NOT_FIRING])
    assert [f.id for f in v.findings if f.id.startswith("liveness.hook")] == [
        F.HOOK_FIRING,
        F.HOOK_NOT_FIRING,
    ]
