"""The arithmetic under `verifier compare` (servewitness/measure/compare.py) and the measurement
window's pace check (servewitness/policy/window.py ``pace``, which the verifier runs when it seals a
window), on hand-made numbers: the noise
floor from replicate boots, one boot per arm (floor unknown), differences beyond and within
the floor; fires and judged steps during a window, lag, no steps, a restarted process."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from servewitness import wire
from servewitness.client.window import load_window, save_window
from servewitness.errors import ConfigError
from servewitness.measure import compare as C
from servewitness.model import HookCount, ProcessKey, RunVerdict, TargetVerdict, Verdict
from servewitness.policy.window import (
    WINDOW_HOOK_LAGGED,
    WINDOW_NO_STEPS,
    WINDOW_PROCESS_CHANGED,
    WindowFinding,
    hook_rows,
)
from servewitness.policy.window import pace as pace_rows

M = "tokens_per_s"


def arm(*per_boot: float | list[float], label: str = "x") -> list[C.Sample]:
    """Samples of one arm: one entry per boot, a list for several samples of that boot."""
    out: list[C.Sample] = []
    for i, v in enumerate(per_boot):
        for x in v if isinstance(v, list) else [v]:
            out.append(C.Sample(f"{label}-boot{i}", label, {m: x for m in C.METRICS}))
    return out


def expected_floor(a: list[float], b: list[float], t: float) -> float:
    """The t test's floor computed here by hand: pooled variance of the logs."""
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    ma, mb = sum(la) / len(la), sum(lb) / len(lb)
    ss = sum((x - ma) ** 2 for x in la) + sum((x - mb) ** 2 for x in lb)
    df = len(a) + len(b) - 2
    return math.expm1(t * math.sqrt(ss / df * (1 / len(a) + 1 / len(b))))


def test_floor_is_t_times_the_standard_error_of_the_log_difference() -> None:
    a, b = [100.0, 110.0], [200.0, 220.0, 240.0]
    c = C.compare(arm(*a, label="a"), arm(*b, label="b"), M)
    assert c.median_a == 105.0 and c.median_b == 220.0
    assert c.spread_a == pytest.approx(10 / 105)  # reported for the reader
    assert c.spread_b == pytest.approx(40 / 220)
    assert c.floor == pytest.approx(expected_floor(a, b, 5.841))  # 3 df, 99 %
    geo = math.sqrt(100 * 110), (200 * 220 * 240) ** (1 / 3)
    assert c.difference == pytest.approx(geo[1] / geo[0] - 1)
    assert c.verdict == "real difference"
    assert c.confidence == 0.99


def test_the_floor_widens_with_confidence_and_narrows_with_boots() -> None:
    a, b = arm(90.0, 110.0, label="a"), arm(95.0, 115.0, label="b")
    floors = [C.compare(a, b, M, conf).floor or 0.0 for conf in C.CONFIDENCES]
    assert floors == sorted(floors) and len(set(floors)) == 3 and floors[0] > 0
    more = C.compare(arm(90.0, 110.0, 90.0, 110.0), arm(95.0, 115.0, 95.0, 115.0), M)
    assert more.floor is not None and floors[1] is not None and more.floor < floors[1]
    with pytest.raises(ConfigError, match="confidence"):
        C.compare(a, b, M, 0.9)


def test_t_critical_values_match_the_table_and_stay_conservative_between_rows() -> None:
    assert C.t_critical(2, 0.99) == 9.925
    assert C.t_critical(11, 0.95) == C.t_critical(10, 0.95) == 2.228  # the lower row: wider
    assert C.t_critical(1000, 0.999) == 3.291  # normal beyond 30


def test_a_boot_without_throughput_cannot_be_compared() -> None:
    with pytest.raises(ConfigError, match="<= 0"):
        C.compare(arm(0.0, 1.0), arm(1.0, 2.0), M)


def test_samples_of_one_boot_are_one_value_not_replicates() -> None:
    # two samples of the same boot are averaged: the arm still has one boot
    c = C.compare(arm([100.0, 140.0], label="a"), arm(100.0, 104.0, label="b"), M)
    assert c.a == [120.0] and c.spread_a is None
    assert (c.floor, c.verdict) == (None, "noise floor unknown")


def test_one_boot_per_arm_leaves_the_floor_unknown_however_large_the_difference() -> None:
    for a, b in ((arm(100.0), arm(300.0)), (arm(99.0, 101.0), arm(300.0))):
        c = C.compare(a, b, M)
        assert (c.floor, c.verdict) == (None, "noise floor unknown")
        assert c.difference == pytest.approx(2.0, rel=1e-3)  # reported, not as a verdict
        text = C.render(c)
        one = "A" if len(c.a) < 2 else "B"
        assert f"noise floor unknown: arm {one} has one boot" in text
        assert "real difference" not in text and "+200.0%" in text


def test_a_difference_within_the_floor_is_not_a_difference() -> None:
    # replicate boots differ by about 20 %; the arms' geometric means by 5 %
    a, b = [90.0, 110.0], [95.0, 115.0]
    c = C.compare(arm(*a, label="a"), arm(*b, label="b"), M)
    assert c.floor == pytest.approx(expected_floor(a, b, 9.925))
    assert c.difference == pytest.approx(math.sqrt(95 * 115) / math.sqrt(90 * 110) - 1)
    assert c.verdict == "within the noise floor"
    assert f"noise floor \u00b1{c.floor:.1%} (99.0% confidence, 2 degrees of freedom): " \
        "within the noise floor" in C.render(c)  # fmt: skip


def test_the_same_difference_beyond_a_tighter_floor_is_real() -> None:
    """Negative control for the test above: about the same 5 % between the arms, with
    replicate boots that agree within 0.2 %, is a real difference; in either direction."""
    c = C.compare(arm(99.9, 100.1, label="a"), arm(104.9, 105.1, label="b"), M)
    assert c.floor is not None and c.floor < 0.02 and c.difference == pytest.approx(0.05, 1e-3)
    assert c.verdict == "real difference"
    down = C.compare(arm(104.9, 105.1, label="b"), arm(99.9, 100.1, label="a"), M)
    assert down.verdict == "real difference" and down.difference < 0


def test_identical_boots_leave_no_floor_and_no_difference() -> None:
    c = C.compare(arm(100.0, 100.0, 100.0, label="a"), arm(100.0, 100.0, label="b"), M)
    assert (c.floor, c.difference, c.verdict) == (0.0, 0.0, "within the noise floor")


def test_replicates_of_one_configuration_are_called_different_at_most_one_time_in_a_hundred() -> (
    None
):
    """The property the floor exists for, on simulated boots: 20 % Gaussian noise on the log
    scale, two boots per arm, the same configuration in both arms. The old floor (the larger
    arm's spread) called about one comparison in five "real"."""
    rng = random.Random(7)  # noqa: S311 - simulated boots, not secrets
    n, real = 4000, 0
    for _ in range(n):
        a = [math.exp(rng.gauss(0, 0.2)) * 100 for _ in range(2)]
        b = [math.exp(rng.gauss(0, 0.2)) * 100 for _ in range(2)]
        real += C.compare(arm(*a, label="a"), arm(*b, label="b"), M).verdict == "real difference"
    assert real / n < 0.015  # 1 % expected at 99 % confidence


def test_as_dict_carries_the_floor_beside_the_difference() -> None:
    d = C.as_dict(C.compare(arm(1.0), arm(2.0), M))
    assert d["noise_floor"] is None and d["verdict"] == "noise floor unknown"
    assert d["a"] == [1.0] and d["b"] == [2.0] and d["difference"] == 1.0


def test_sample_values_and_files(tmp_path: Path) -> None:
    v = C.sample_values(steps=10, tokens=40, decode=30, seconds=2.0)
    assert v == {"tokens_per_s": 20.0, "tokens_per_step": 4.0, "decode_tokens_per_s": 15.0}
    assert C.sample_values(0, 0, 0, 0.0) == dict.fromkeys(C.METRICS, 0.0)
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"sample": 1, "boot": "b/1/2", "label": "c1", **v}))
    s = C.load_sample(f)
    assert (s.boot, s.label, s.values) == ("b/1/2", "c1", v)
    f.write_text(json.dumps({"sample": 2, "boot": "b", **v}))
    with pytest.raises(ConfigError, match="not a sample file"):
        C.load_sample(f)
    with pytest.raises(ConfigError, match="no such sample file"):
        C.load_sample(tmp_path / "missing.json")


# -- window pace -------------------------------------------------------------------------------


def hc(
    fired_decode: int, decode_steps: int, pid: int = 7, name: str = "h", min_fires: float = 1.0
) -> HookCount:
    """One hook's counts, judged on decode steps."""
    return HookCount(
        name, pid, "worker", 0, fired=fired_decode, fired_productive=fired_decode,
        productive_steps=decode_steps, total_steps=decode_steps + 1, fired_decode=fired_decode,
        decode_steps=decode_steps, on="decode", min_fires_per_step=min_fires,
    )  # fmt: skip


def rv(*hooks: HookCount, verdict: Verdict = Verdict.PASS) -> RunVerdict:
    t = TargetVerdict("t", verdict, (), 0.0, 0.0, tuple(hooks))
    return RunVerdict("r", "digest", verdict, (t,), (), 0.0)


def pace(
    start: RunVerdict, end: RunVerdict, keys: dict[tuple[str, int], ProcessKey] | None = None
) -> tuple[dict[str, dict[str, object]], list[WindowFinding]]:
    return pace_rows(hook_rows(start, keys or {}), hook_rows(end, keys or {}))


def test_pace_counts_only_what_happened_during_the_window() -> None:
    rows, found = pace(rv(hc(100, 100)), rv(hc(130, 130)))
    assert found == []
    (row,) = rows.values()
    assert (row["fired"], row["steps"], row["fired_in_all"], row["total_steps"]) == (30, 30, 30, 30)


def test_pace_flags_a_hook_that_fell_behind_during_the_window() -> None:
    # over the process's life 130 of 160 (81 %); during the window 30 of 60
    _, found = pace(rv(hc(100, 100)), rv(hc(130, 160)))
    assert [f.id for f in found] == [WINDOW_HOOK_LAGGED]
    assert (found[0].context["fired"], found[0].context["steps"]) == (30, 60)
    assert "fired 30 times on 60 decode steps during the window" in found[0].message


def test_pace_honours_the_policys_minimum_per_step() -> None:
    assert pace(rv(hc(0, 0, min_fires=0.5)), rv(hc(30, 60, min_fires=0.5)))[1] == []  # enough
    (f,) = pace(rv(hc(0, 0, min_fires=0.5)), rv(hc(29, 60, min_fires=0.5)))[1]
    assert f.id == WINDOW_HOOK_LAGGED


def test_pace_without_judged_steps_is_no_evidence() -> None:
    (f,) = pace(rv(hc(100, 100)), rv(hc(100, 100)))[1]
    assert f.id == WINDOW_NO_STEPS


def test_pace_flags_processes_that_came_or_went() -> None:
    # (other hooks: not one process restarted in the other's place, see below)
    rows, found = pace(rv(hc(10, 10, pid=1, name="a")), rv(hc(20, 20, pid=2, name="b")))
    assert rows == {}
    assert [f.id for f in found] == [WINDOW_PROCESS_CHANGED, WINDOW_PROCESS_CHANGED]
    assert "was not there when the window opened" in found[0].message
    assert "is gone" in found[1].message
    # the same serving slot (target, role, rank, hook) under another pid: one restart
    rows, found = pace(rv(hc(10, 10, pid=1)), rv(hc(20, 20, pid=2)))
    assert rows == {} and [f.context.get("restarted") for f in found] == [True]


def test_pace_judges_each_hook_and_process_on_its_own_counts() -> None:
    start = rv(hc(10, 10, name="a"), hc(10, 10, name="b"), hc(10, 10, name="a", pid=8))
    end = rv(hc(20, 20, name="a"), hc(12, 20, name="b"), hc(20, 20, name="a", pid=8))
    rows, found = pace(start, end)
    assert len(rows) == 3
    assert [(f.id, f.context["name"], f.context["pid"]) for f in found] == [
        (WINDOW_HOOK_LAGGED, "b", 7)
    ]


def test_pace_names_a_process_restarted_under_the_same_pid() -> None:
    """pid reuse: the same pid with another start time is another process (its counters
    restarted), never a window that 'kept pace' on the difference."""
    before = hook_rows(rv(hc(100, 100)), {("t", 7): ProcessKey("b", 7, 1000)})
    after = hook_rows(rv(hc(130, 130)), {("t", 7): ProcessKey("b", 7, 2000)})
    rows, found = pace_rows(before, after)
    assert rows == {}
    # one restart, said as one: the same target, role, rank and hook, another process
    (restart,) = found
    assert restart.id == WINDOW_PROCESS_CHANGED and restart.context["restarted"] is True
    assert "restarted during the window" in restart.message
    assert restart.context["was"].startswith("t/pid 7@1000/")
    assert restart.context["hook"].startswith("t/pid 7@2000/")


def test_pace_says_gone_and_new_apart_when_they_are_not_one_restart() -> None:
    """Negative control: a process gone from one target and a new one in another target are
    two changes, not a restart; each is named as before."""
    before = hook_rows(rv(hc(100, 100)), {("t", 7): ProcessKey("b", 7, 1000)})
    after = {k.replace("t/", "u/", 1): v for k, v in before.items()}
    rows, found = pace_rows(before, after)
    assert rows == {} and len(found) == 2
    assert all(f.id == WINDOW_PROCESS_CHANGED and "restarted" not in f.context for f in found)
    assert {"is gone" in f.message for f in found} == {True, False}


def test_a_window_file_holds_only_the_id_and_an_older_one_is_named(tmp_path: Path) -> None:
    """The window file is not trust-bearing: an id, the run and the verifier's address; a
    client-side window file of an older verifier (1, 2) gets a clear error."""
    path = tmp_path / "w.json"
    opened = wire.OpenedWindow("ab" * 16, "r", "d", 1.0, 5, "0" * 64)
    save_window(path, "unix:/v.sock", opened)
    got = load_window(path)
    assert (got["window_id"], got["run"], got["verifier"]) == ("ab" * 16, "r", "unix:/v.sock")
    assert "verdict" not in got and "hooks" not in got
    for old in (1, 2):
        path.write_text(json.dumps({"window": old, "opened_unix": 1.0, "verdict": {"run": "r"}}))
        with pytest.raises(ConfigError, match=r"older verifier .* open the window again"):
            load_window(path)
