"""Verdicts kept, not recomputed per status call (``servewitness.policy.engine.Judgements``): what a
(policy, target snapshot) evaluation finds is kept until a new report or another policy, and
only the age is judged on every call. The answer must be exactly what a fresh evaluation
gives: each step below compares the verifier's evaluator (with what it kept) against a fresh
policy object evaluating the same snapshots at the same instant, across report arrivals, a
staleness boundary crossed with no report arriving, and a second run with another policy over
the same targets. The age clock is set by the test (``clock.boot_s``), so no sleeps."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servewitness import wire
from servewitness.model import RunVerdict, TargetReport, Verdict
from servewitness.policy import evaluate_run, load_policy, policy_digest
from servewitness.server import clock, follow
from servewitness.server.evaluate import Evaluator
from servewitness.server.store import RunRecord, Store, StoredReport
from servewitness.wire import verdicts as wire_verdicts
from tests.helpers import as_weak_as_needed
from tests.test_policy_engine import HOOK_V1, api, engine, worker

FRESH_S = 10.0
T0 = 5000.0  # the age clock when the first reports arrive
POLICY = as_weak_as_needed(f"version = 1\n{HOOK_V1}[evidence]\nfreshness_s = {FRESH_S}\n")
# another policy over the same targets: the hook must fire far more often than it did
STRICT = POLICY.replace(
    'name = "v1_step"\n', 'name = "v1_step"\nmin_fires_per_productive_step = 1000\n', 1
)


class Age:
    now = T0


@pytest.fixture
def evaluator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Evaluator:
    monkeypatch.setattr(clock, "boot_s", lambda: Age.now)
    Age.now = T0
    return Evaluator(Store(tmp_path / "db.sqlite3"))


def register(ev: Evaluator, name: str, text: str) -> RunRecord:
    return ev.store.register_run(name, text, policy_digest(text), "test")


def note(ev: Evaluator, target: str, seq: int, hooked: bool) -> None:
    procs = (api(), engine(), worker() if hooked else worker(hooks=()))
    sent = 1_700_000_000.0 + Age.now
    ev.note(TargetReport("a-" + target, target, seq, "", sent, procs), sent, "local", Age.now)


def fresh(ev: Evaluator, run: RunRecord, now: float) -> RunVerdict:
    """The verdict as a first evaluation computes it: a policy object never used before."""
    pol = load_policy(run.policy_toml, run.source)
    return evaluate_run(run.name, pol, run.policy_digest, ev.snapshots(), now, now_boot_s=Age.now)


def both(ev: Evaluator, run: RunRecord) -> tuple[RunVerdict, RunVerdict]:
    now = 1_700_000_000.0 + Age.now
    return ev.run_verdict(run, now), fresh(ev, run, now)


def verdicts(v: RunVerdict) -> dict[str, Verdict]:
    return {t.target: t.verdict for t in v.targets}


def test_kept_verdicts_equal_fresh_ones_across_reports_staleness_and_policies(
    evaluator: Evaluator,
) -> None:
    ev = evaluator
    run = register(ev, "r", POLICY)
    note(ev, "a", 1, hooked=True)
    note(ev, "b", 1, hooked=False)
    steps: list[tuple[float, str, dict[str, Verdict]]] = []

    def check(label: str) -> None:
        kept, first = both(ev, run)
        assert kept == first, label
        steps.append((Age.now, label, verdicts(kept)))

    check("first reports")
    Age.now = T0 + FRESH_S - 0.001
    check("just fresh")
    assert ev.judgements.hits > 0  # reused, not recomputed: this is the kept path
    Age.now = T0 + FRESH_S + 0.001  # no report arrived: both turn STALE on time
    check("just stale")
    note(ev, "a", 2, hooked=False)  # a new report: its new evidence is judged, not the old
    check("a reports again, unhooked")
    Age.now += FRESH_S / 2
    note(ev, "b", 2, hooked=True)
    check("b reports again, hooked")
    assert [(label, v) for _, label, v in steps] == [
        ("first reports", {"a": Verdict.PASS, "b": Verdict.FAIL}),
        ("just fresh", {"a": Verdict.PASS, "b": Verdict.FAIL}),
        ("just stale", {"a": Verdict.STALE, "b": Verdict.STALE}),
        ("a reports again, unhooked", {"a": Verdict.FAIL, "b": Verdict.STALE}),
        ("b reports again, hooked", {"a": Verdict.FAIL, "b": Verdict.PASS}),
    ]
    # a run registered with another policy over the same snapshots reuses nothing of the first
    strict = register(ev, "strict", STRICT)
    kept, first = both(ev, strict)
    assert kept == first
    assert verdicts(kept)["b"] != Verdict.PASS  # negative control: "b" PASSes under POLICY
    assert verdicts(ev.run_verdict(run, 1_700_000_000.0 + Age.now))["b"] == Verdict.PASS


def test_a_stale_verdict_is_recomputed_with_its_age_each_call(evaluator: Evaluator) -> None:
    """The STALE finding names the evidence's age: two calls a second apart differ in it,
    each equal to a fresh evaluation (nothing of a stale verdict is kept beyond the rules')."""
    ev = evaluator
    run = register(ev, "r", POLICY)
    note(ev, "a", 1, hooked=True)
    Age.now = T0 + FRESH_S + 1
    kept1, first1 = both(ev, run)
    Age.now += 1
    kept2, first2 = both(ev, run)
    assert (kept1, kept2) == (first1, first2)
    stale = [dataclasses.asdict(v.targets[0].findings[0]) for v in (kept1, kept2)]
    assert stale[0]["id"] == stale[1]["id"] == "evidence.stale"
    assert stale[0] != stale[1]


def counting(
    monkeypatch: pytest.MonkeyPatch, name: str, label: Callable[[Any], str]
) -> tuple[list[str], Callable[[Any], Any], Callable[[Any], Any]]:
    """``wire.verdicts.NAME`` replaced by one that lists the LABEL of each thing it converts:
    (that list, the original, the replacement)."""
    from servewitness.wire import verdicts as V

    built: list[str] = []
    convert = getattr(V, name)

    def counted(x: Any) -> Any:
        built.append(label(x))
        return convert(x)

    monkeypatch.setattr(V, name, counted)
    return built, convert, counted


def test_a_kept_finding_s_message_is_built_once_and_equals_a_fresh_one(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status answers reuse each kept finding's message (``wire.verdicts.finding_to_pb``):
    a second answer builds none, its bytes equal an answer built without the cache, and a
    new report (new findings) is built afresh, not answered from the old messages."""
    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.wire import verdicts as V

    built, convert, counted = counting(monkeypatch, "_finding_to_pb", lambda f: f.id)
    ev = evaluator
    run = register(ev, "r", POLICY)
    note(ev, "a", 1, hooked=True)
    note(ev, "b", 1, hooked=False)
    now = 1_700_000_000.0 + Age.now

    def answer() -> bytes:
        return wire.get_run_status_response_to_pb(ev.run_verdict(run, now)).SerializeToString()

    first = answer()
    assert built, "the first answer converts its findings"
    built.clear()
    again = answer()
    # kept: the targets' findings are not rebuilt (only the run-level ones, made per call)
    assert again == first
    assert built == [f.id for f in ev.run_verdict(run, now).findings]
    monkeypatch.setattr(V, "finding_to_pb", convert)  # no cache at all: the same bytes
    assert answer() == first
    monkeypatch.undo()
    monkeypatch.setattr(clock, "boot_s", lambda: Age.now)
    monkeypatch.setattr(V, "_finding_to_pb", counted)
    built.clear()
    note(ev, "b", 2, hooked=True)  # b's hook now fires: new findings for b, built afresh
    changed = answer()
    assert built and changed != first
    told = wire.get_run_status_response_from_pb(pb.GetRunStatusResponse.FromString(changed))
    fresh_told = ev.run_verdict(run, now)
    assert [(t.target, t.findings) for t in told.targets] == [
        (t.target, t.findings) for t in fresh_told.targets
    ]  # every finding as the evaluator has it now, none an old message
    assert verdicts(told) == verdicts(fresh_told) == {
        "a": Verdict.PASS, "b": Verdict.PASS,
    }  # fmt: skip


def test_a_kept_target_verdicts_message_is_copied_with_the_time_of_the_call(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A target's verdict that is still fresh keeps its findings and hooks: its message is
    copied from the one made before (``wire.verdicts._set_target_verdict``), never rebuilt.
    What the copy must not keep is the old time: each answer says when IT was evaluated, and
    equals the evaluator's verdict of that instant. Two runs with different policies over the
    same targets, asked in turn, never get each other's message; a new report gets a new one."""
    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb

    built, _, _ = counting(monkeypatch, "_hook_count_to_pb", lambda h: h.name)
    ev = evaluator
    lax, strict = register(ev, "r", POLICY), register(ev, "strict", STRICT)
    note(ev, "a", 1, hooked=True)
    note(ev, "b", 1, hooked=True)

    def told(run: RunRecord, now: float) -> RunVerdict:
        msg = wire.get_run_status_response_to_pb(ev.run_verdict(run, now))
        back = pb.GetRunStatusResponse.FromString(msg.SerializeToString())
        return wire.get_run_status_response_from_pb(back)

    now = 1_700_000_000.0 + Age.now
    answers = [told(lax, now), told(strict, now)]
    assert built, "the first answers build the hooks' messages"
    built.clear()
    for i in range(1, 4):  # later calls, the runs in turn: copies, each with its own time
        Age.now += 1
        for run in (lax, strict):
            got = told(run, now + i)
            assert got == ev.run_verdict(run, now + i)
            assert {t.evaluated_unix for t in got.targets} == {now + i}
            answers.append(got)
    assert built == []  # nothing rebuilt: every target verdict was a copy
    assert verdicts(answers[0]) == {"a": Verdict.PASS, "b": Verdict.PASS}
    assert verdicts(answers[1]) == {"a": Verdict.FAIL, "b": Verdict.FAIL}  # STRICT's own
    note(ev, "b", 2, hooked=False)  # a new report: b's verdict changes, its message is new
    got = told(lax, now + 9)
    assert built and verdicts(got) == {"a": Verdict.PASS, "b": Verdict.FAIL}
    assert got == ev.run_verdict(lax, now + 9)


def test_a_report_is_judged_as_it_arrives_not_when_status_is_asked(evaluator: Evaluator) -> None:
    """Once a run's policy is loaded (its first status call), and while status calls ask,
    each report noted is judged then, with its verdict's message made: the status call that
    follows judges nothing and answers what a fresh evaluation gives. Controls: before any
    status call asked, nothing is judged ahead; a run whose policy was never asked for is not
    judged ahead (its first status call judges every target then)."""
    ev = evaluator
    run = register(ev, "r", POLICY)
    note(ev, "a", 1, hooked=True)
    both(ev, run)  # loads POLICY
    before = ev.judgements.misses
    note(ev, "a", 2, hooked=True)
    assert ev.judgements.misses == before  # no status call asked lately: nothing judged ahead
    ev.asked()  # a status call
    note(ev, "a", 3, hooked=False)
    note(ev, "b", 1, hooked=True)
    assert ev.judgements.misses == before + 2  # judged as noted
    kept, first = both(ev, run)
    assert kept == first and verdicts(kept) == {"a": Verdict.FAIL, "b": Verdict.PASS}
    assert ev.judgements.misses == before + 2  # the status call judged nothing
    a_findings = kept.targets[0].findings
    (made,) = [m for tv, m, _ in wire_verdicts._VERDICTS_KEPT["a"] if tv.findings is a_findings]
    assert made.target == "a" and made.verdict  # its message was made with it
    strict = register(ev, "strict", STRICT)
    note(ev, "c", 1, hooked=True)
    assert ev.judgements.misses == before + 3  # POLICY only: STRICT is not loaded
    kept, first = both(ev, strict)
    assert kept == first and ev.judgements.misses == before + 6  # a, b, c judged on demand


def test_a_followed_report_is_judged_as_it_is_followed(tmp_path: Path) -> None:
    """Another verifier on the same database stores a report; this one follows it and judges
    it then, under the policies it has loaded, so its status call judges nothing."""
    db = tmp_path / "db.sqlite3"
    here, there = Store(db), Store(db)
    try:
        ev = Evaluator(here)
        follower = follow.Follower(here, ev)
        run = register(ev, "r", POLICY)
        follower.poll()
        ev.asked()  # a status call ...
        ev.run_verdict(run, time.time())  # ... loads POLICY (no target yet)
        before = ev.judgements.misses
        rep = TargetReport("agent-t", "t", 1, "", time.time(), (api(), engine(), worker()))
        sent = StoredReport("agent-t", 1, "t", time.time(), wire.report_to_bytes(rep), None)
        assert there.save_report(sent, {})
        assert follower.poll() == 1
        assert ev.judgements.misses == before + 1  # judged as followed
        got = ev.run_verdict(run, time.time())
        assert [t.target for t in got.targets] == ["t"] and ev.judgements.misses == before + 1
    finally:
        here.close()
        there.close()
