"""A window's two ends compared beyond its hooks (``policy/window_ends.py``): the same
processes (boot id, pid, start ticks, every role of the serving setup), each process that runs
steps stepped whether or not the policy declares hooks, and the verifier's clocks relating the
open and the seal; and ``verifier audit verify-seal`` deriving all three again from the signed
seal.

The pure judgements are tested on evidence rows as the verifier writes them; the rest on a real
``verifier serve`` over mutual TLS with real reports (the lab of ``test_gate_time_attacks``).
``tests/data/seals_before_window_ends/`` holds three seals the verifier of commit 07a26f5 (before
these checks) signed in that lab: an honest window, a window whose worker restarted on a
runner-only policy, and a window sealed after the verifier's wall clock was stepped back two
hours; all three were held, and ``verifier.pub`` is that verifier's key.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servewitness.ledger import dsse, keys
from servewitness.ledger import statement as st
from servewitness.ledger.verify_seal import check_seal
from servewitness.model import ProcessReport
from servewitness.policy import window as pw
from servewitness.policy import window_ends as pe
from tests.helpers import REPO
from tests.test_gate_time_attacks import (
    Lab,
    content_of,
    make_lab,
    moved,
    procs,
    started_lab,
    window,
)
from tests.test_policy_engine import dead_v2_hook, hook, steps, worker

OLD = REPO / "tests" / "data" / "seals_before_window_ends"


def row(pid: int, role: str = "worker", rank: int | None = 0, **kw: Any) -> dict[str, Any]:
    """One evidence row of a window's content, as ``server/windows.py`` writes it."""
    out: dict[str, Any] = {
        "target": "t", "boot_id": "boot-a", "pid": pid, "start_ticks": 1000 + pid, "role": role,
        "rank": rank, "steps_total": 10, "steps_productive": 8, "runs_steps": role == "worker",
    }  # fmt: skip
    out.update(kw)
    return out


def tp2(**rank1: Any) -> list[dict[str, Any]]:
    """An API server, an engine core and two tensor-parallel workers; RANK1: rank 1's fields."""
    return [
        row(100, "api_server", None),
        row(200, "engine_core", None),
        row(300, rank=0),
        {**row(301, rank=1), **rank1},
    ]


def stepped(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """ROWS with every worker N productive steps further."""
    return [
        {**r, "steps_total": r["steps_total"] + n, "steps_productive": r["steps_productive"] + n}
        if r["runs_steps"]
        else r
        for r in rows
    ]


def ids(found: list[pw.WindowFinding]) -> list[str]:
    return [f.id for f in found]


# ------------------------------------------------------------------ the same processes


def test_the_same_processes_at_both_ends_change_nothing() -> None:
    """Control: the same four processes (steps moved on) at the seal: no finding."""
    assert pe.same_processes(tp2(), stepped(tp2(), 5)) == []


def test_a_tp2_run_where_one_rank_restarts_names_that_rank_alone() -> None:
    """Tensor parallel 2, rank 1 restarted (another pid and start tick, counts from zero):
    one restart, of rank 1; rank 0 and the other processes are not named."""
    at_seal = stepped(tp2(pid=309, start_ticks=5309, steps_total=2, steps_productive=1), 5)
    (f,) = pe.same_processes(tp2(), at_seal)
    assert f.id == pw.WINDOW_PROCESS_CHANGED
    assert (f.context["change"], f.context["was"]["pid"], f.context["process"]["pid"]) == (
        "restarted",
        301,
        309,
    )
    assert f.context["process"]["rank"] == 1
    assert "worker rank 1 (pid 301) was replaced during the window by worker rank 1 (pid 309)" in (
        f.message
    )


def test_a_worker_that_appears_mid_window_breaks_it() -> None:
    """A second worker the open did not see (vLLM spawned another, or a process joined the
    tree): another serving setup, named as appeared."""
    (f,) = pe.same_processes(tp2()[:3], tp2())
    assert (f.id, f.context["change"], f.context["process"]["pid"]) == (
        pw.WINDOW_PROCESS_CHANGED,
        "appeared",
        301,
    )
    # and the reverse: a worker gone
    (g,) = pe.same_processes(tp2(), tp2()[:3])
    assert (g.context["change"], g.context["process"]["pid"]) == ("gone", 301)


def test_the_same_pid_and_start_on_another_boot_is_another_process() -> None:
    """A host rebooted in the window, its server back with the same pids and start ticks:
    every process is another one (said as rebooted, naming both boots)."""
    found = pe.same_processes(tp2(), [{**r, "boot_id": "boot-b"} for r in stepped(tp2(), 500)])
    assert [f.context["change"] for f in found] == ["rebooted"] * 4
    assert "boot boot-a at the open, boot-b at the seal" in found[0].message


def test_an_api_server_replaced_is_a_changed_process() -> None:
    """The process that receives the benchmark's requests is compared like any other."""
    at_seal = [row(150, "api_server", None), *tp2()[1:]]
    (f,) = pe.same_processes(tp2(), at_seal)
    assert (f.context["change"], f.context["process"]["role"]) == ("restarted", "api_server")


def test_helpers_and_unknown_processes_may_come_and_go() -> None:
    """Negative control: a resource tracker or a compiler a kernel build started is not the
    serving setup; it may appear or leave without breaking the window."""
    at_open = [*tp2(), row(400, "helper", None)]
    at_seal = [*tp2(), row(401, "unknown", None), row(402, "unknown", None)]
    assert pe.same_processes(at_open, at_seal) == []


def test_a_target_that_joins_or_leaves_the_run_is_named_once() -> None:
    """A target of the run not reported at the open that reports at the seal (a replica that
    joined), or the reverse: one finding per target, listing its processes."""
    other = [{**r, "target": "u"} for r in tp2()]
    joined = pe.same_processes(tp2(), [*tp2(), *other])
    assert [(f.context["change"], f.context["target"]) for f in joined] == [
        ("target_appeared", "u")
    ]
    assert [p["pid"] for p in joined[0].context["processes"]] == [100, 200, 300, 301]
    left = pe.same_processes([*tp2(), *other], tp2())
    assert [(f.context["change"], f.context["target"]) for f in left] == [("target_gone", "u")]


def test_the_hook_rows_of_a_changed_process_are_not_compared() -> None:
    """``changed_tags``/``without``: a rebooted worker's hook rows (same pid@start key) are
    left out of pace, so no count is compared across the reboot."""
    found = pe.same_processes(tp2(), [{**r, "boot_id": "boot-b"} for r in tp2()])
    hooks: dict[str, dict[str, Any]] = {
        "t/pid 300@1300/h/productive": {},
        "t/pid 9@9/h/productive": {},
    }
    assert pe.without(hooks, pe.changed_tags(found)) == {"t/pid 9@9/h/productive": {}}


# ------------------------------------------------------------------ progress


def test_every_process_that_runs_steps_must_step() -> None:
    """Both ranks stepped: nothing. Rank 1 idle (a runner-only policy, no hook rows): its
    no_steps, naming its counts; rank 0 is not named."""
    assert pe.progress(tp2(), stepped(tp2(), 3), {}) == []
    at_seal = [*stepped(tp2()[:3], 3), tp2()[3]]
    (f,) = pe.progress(tp2(), at_seal, {}) or []
    assert (f.id, f.context["process"]["rank"]) == (pw.WINDOW_NO_STEPS, 1)
    assert (f.context["steps_at_open"], f.context["steps_at_seal"]) == (8, 8)


def test_empty_steps_are_not_progress() -> None:
    """Steps with nothing scheduled (total up, productive not) prove nothing was served."""
    at_seal = [{**r, "steps_total": r["steps_total"] + 50} for r in tp2()]
    assert ids(pe.progress(tp2(), at_seal, {}) or []) == [pw.WINDOW_NO_STEPS] * 2


def test_a_stepping_process_whose_steps_are_not_counted_is_no_evidence() -> None:
    """A worker with no step counts (no probe), or a target with no process that runs steps
    at either end: no_steps, fail closed."""
    blind = [{**r, "steps_total": None, "steps_productive": None} for r in tp2()]
    found = pe.progress(blind, blind, {}) or []
    assert ids(found) == [pw.WINDOW_NO_STEPS] * 2 and "not counted" in found[0].message
    none = [{**r, "runs_steps": False} for r in tp2()]
    (f,) = pe.progress(none, none, {}) or []
    assert "no process runs steps the window could count" in f.message


def test_progress_does_not_repeat_a_hooks_no_steps_and_reads_older_windows() -> None:
    """A worker whose hook row already says no_steps is not said twice; a window opened by an
    older verifier (no productive count at the open) is judged on its engine steps; a seal
    whose rows do not say which processes run steps is not judged (None)."""
    idle = {"t/pid 300@1300/h/productive": {"steps": 0}}
    assert pe.progress(tp2()[:3], tp2()[:3], idle) == []
    older = [{k: v for k, v in r.items() if k not in ("steps_productive", "runs_steps")}
             for r in tp2()]  # fmt: skip
    assert pe.progress(older, stepped(tp2(), 2), {}) == []
    (f,) = pe.progress(older, tp2()[:3], {}) or []
    assert "10 engine steps at the open and 10 at the seal" in f.message
    assert pe.progress(tp2(), older, {}) is None


# ------------------------------------------------------------------ times

CLOCK = "CLOCK_BOOTTIME"


def at(boot: str | None, s: float) -> dict[str, Any]:
    return pe.verifier_clock(boot, s, CLOCK)


def test_a_seal_dated_before_its_open_is_named_whatever_the_boot() -> None:
    """Sealed 7,200 s before it opened: on the same boot (the message gives the true length),
    on another boot, and with no clock recorded at the seal."""
    span, found = pe.elapsed(10_000.0, 2_800.0, at("b1", 500.0), at("b1", 510.0))
    assert ids(found) == [pw.WINDOW_SEALED_BEFORE_OPEN] and span["wall_s"] == -7200.0
    assert "on its boot clock the window lasted 10.0 s" in found[0].message
    for seal_clock in (at("b2", 5.0), None):
        span, found = pe.elapsed(10_000.0, 2_800.0, at("b1", 500.0), seal_clock)
        assert ids(found) == [pw.WINDOW_SEALED_BEFORE_OPEN] and span["boot_s"] is None


def test_a_wall_clock_stepped_during_the_window_is_named_on_the_same_boot() -> None:
    """Same boot: the boot clock says 10 s, the wall clock 3,610 s (stepped forward an hour):
    clock_stepped. Within the tolerance (NTP slewing, the readings' own delay): nothing."""
    span, found = pe.elapsed(1000.0, 4610.0, at("b1", 500.0), at("b1", 510.0))
    assert ids(found) == [pw.WINDOW_CLOCK_STEPPED]
    assert span == {"wall_s": 3610.0, "boot_s": 10.0, "same_boot": True}
    assert pe.elapsed(1000.0, 1011.5, at("b1", 500.0), at("b1", 510.0))[1] == []
    # a long window: 0.1 % of it is tolerated (a day: 86 s)
    assert pe.elapsed(0.0, 86_450.0, at("b1", 0.0), at("b1", 86_400.0))[1] == []


def test_another_boot_or_no_clock_at_the_open_says_so_and_finds_nothing() -> None:
    """The verifier's host booted again (its boot clock restarted), or the window was opened
    by a verifier that recorded no clock: the lengths cannot be related; said, not a finding."""
    span, found = pe.elapsed(1000.0, 4610.0, at("b1", 500.0), at("b2", 20.0))
    assert (span, found) == ({"wall_s": 3610.0, "boot_s": None, "same_boot": False}, [])
    span, found = pe.elapsed(1000.0, 4610.0, None, at("b2", 20.0))
    assert (span["same_boot"], found) == (None, [])
    span, found = pe.elapsed(1000.0, 4610.0, at(None, 1.0), at(None, 20.0))
    assert (span["same_boot"], found) == (None, [])


# ------------------------------------------------------------------ a real verifier


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with started_lab(tmp_path_factory.mktemp("window-ends")) as L:
        yield L


def ranks(n: int = 0, **rank1: Any) -> tuple[ProcessReport, ...]:
    """``procs(n=N)`` with a second worker, rank 1 (pid 301), stepping and firing alike;
    RANK1: fields of rank 1 replaced."""
    w1 = worker(301, 1, step=steps(total=10 + n, productive=8 + n),
                hooks=(hook(fired=10 + n, fired_productive=8 + n), dead_v2_hook()))  # fmt: skip
    a, e, w0 = procs(n=n)
    w1 = dataclasses.replace(w1, key=dataclasses.replace(w1.key, boot_id=w0.key.boot_id))
    w1 = dataclasses.replace(w1, manifest_digest=w0.manifest_digest, **rank1)
    return a, e, w0, w1


def finding_ids(content: dict[str, Any]) -> list[str]:
    return [f["id"] for f in content["seal"]["findings"]]


def test_a_tp2_window_holds_only_while_both_ranks_stay_the_same(lab: Lab) -> None:
    """Two workers (tensor parallel 2) on a hooked policy: the same two, both stepping, held
    and verified, the seal recording which processes run steps and the verifier's clocks.
    Then a window in which only rank 1 restarts: one process_changed, naming rank 1, and
    verify-seal exit 1 naming it."""
    sealed, out, content = window(lab, "api", ranks(0), ranks(40))
    assert sealed.held and out.returncode == 0, out.stdout + out.stderr
    ev = content["seal"]["evidence"]
    assert {(e["pid"], e["runs_steps"]) for e in ev} == {(100, False), (200, False),
                                                         (300, True), (301, True)}  # fmt: skip
    assert content["seal"]["elapsed"]["same_boot"] is True
    assert (
        content["window"]["verifier_clock"]["boot_id"]
        == content["seal"]["verifier_clock"]["boot_id"]
    )
    assert "ok   times: sealed" in out.stdout
    w1 = ranks(50)[3]
    restarted = moved(dataclasses.replace(w1, steps=steps(3, 2)), 311, 9311)
    sealed, out, content = window(lab, "api", ranks(50), (*ranks(60)[:3], restarted))
    assert (sealed.held, out.returncode) == (False, 1), out.stdout
    (f,) = content["seal"]["findings"]
    assert (f["id"], f["context"]["was"]["rank"], f["context"]["was"]["pid"]) == (
        "window.process_changed",
        1,
        301,
    )
    assert "finding window.process_changed" in out.stdout and "rank 1 (pid 301)" in out.stdout


def test_a_second_worker_appearing_mid_window_breaks_it(lab: Lab) -> None:
    """Variation (not among the attacks): one worker at the open, a second one at the seal
    (vLLM re-spawned with more workers, or a process put in the tree); the first kept stepping
    with its hook firing. Another serving setup: process_changed (appeared), not held."""
    sealed, out, content = window(lab, "restart", procs(n=100), ranks(140))
    assert (sealed.held, out.returncode) == (False, 1), out.stdout
    assert finding_ids(content) == ["window.process_changed"]
    assert content["seal"]["findings"][0]["context"]["change"] == "appeared"


def resigned(lab: Lab, seal_json: str, edit: Any, name: str) -> dict[str, Any]:
    """SEAL_JSON with its statement edited by EDIT(predicate) and signed again with the
    verifier's own key (what its key holder could do): verify-seal's result as JSON."""
    doc = json.loads(seal_json)
    stmt = json.loads(base64.b64decode(doc["envelope"]["payload"]))
    edit(stmt["predicate"])
    key = keys.load_private_key(lab.dir / "db.sqlite3.signing.key")
    doc["envelope"] = dsse.sign(st.encode(stmt), st.PAYLOAD_TYPE, key)
    pub = keys.load_public_key(lab.dir / "db.sqlite3.signing.key.pub")
    return check_seal(json.dumps(doc).encode(), pub).to_json()


def test_verify_seal_derives_the_window_ends_again_from_a_resigned_seal(lab: Lab) -> None:
    """A held seal whose signed content was edited and signed again with the verifier's key:
    every derived check names the edit (besides the ledger entry the content no longer
    recomputes): a restart in the evidence, the seal dated before its open, an elapsed time
    or a clock that does not recompute, a worker that did not step, an open time that is not
    the window's, evidence that cannot be read."""
    sealed, out, _ = window(lab, "gen", procs(n=0), procs(n=40))
    assert sealed.held and out.returncode == 0

    def restart(p: dict[str, Any]) -> None:
        p["seal"]["evidence"][2]["pid"] = 999

    def early(p: dict[str, Any]) -> None:
        p["seal"]["sealed_unix"] = p["window"]["opened_unix"] - 60

    def longer(p: dict[str, Any]) -> None:
        p["seal"]["elapsed"]["boot_s"] = 3600.0

    def other_boot(p: dict[str, Any]) -> None:
        p["window"]["verifier_clock"]["boot_id"] = "another-boot"

    def idle(p: dict[str, Any]) -> None:
        w = p["seal"]["evidence"][2]
        w["steps_productive"] = p["window"]["evidence"][2]["steps_productive"]
        p["seal"]["hooks"] = {}

    def malformed(p: dict[str, Any]) -> None:
        p["seal"]["verifier_clock"] = {"boot_id": 7}

    def moved_open(p: dict[str, Any]) -> None:
        p["seal"]["opened_unix"] -= 3600

    def garbled(p: dict[str, Any]) -> None:
        p["seal"]["evidence"][0]["pid"] = "not a pid"

    for edit, why in (
        (restart, "held, yet the seal's own evidence shows window.process_changed"),
        (early, "before the window opened"),
        (longer, "do not recompute from its clocks"),
        (other_boot, "do not recompute from its clocks"),
        (idle, "held, yet the seal's own evidence shows window.no_steps"),
        (malformed, "the verifier's clock recorded at the open or the seal is malformed"),
        (moved_open, "the seal dates the window's open otherwise than the window content"),
        (garbled, "the evidence of the window or the seal is malformed"),
    ):
        r = resigned(lab, sealed.seal_json, edit, edit.__name__)
        assert not r["ok"] and any(why in p for p in r["problems"]), (edit.__name__, r["problems"])
    # Control: signed again unedited, it still verifies.
    assert resigned(lab, sealed.seal_json, lambda p: None, "same")["ok"] is True


def test_a_wall_clock_stepped_during_the_window_breaks_it(tmp_path: Path) -> None:
    """The verifier's host clock stepped one hour FORWARD between the open and the seal (the
    verifier restarted meanwhile): the seal is not dated before its open, but its wall-clock
    length disagrees with its boot clock's: window.clock_stepped, not held, verify-seal exit
    1 naming it. Stepped back, the seal names window.sealed_before_open."""
    L = make_lab(tmp_path / "v")
    opened: dict[str, str] = {}

    def feed(target: str, n: int, skew_s: float = 0.0) -> Callable[[], None]:
        return lambda: L.report(target, procs(n=n), skew_s=skew_s)

    L.start()
    try:
        for t in ("gen", "api"):
            opened[t] = L.open(t, feed(t, 0)).window_id
    finally:
        L.stop()
    for t, skew, want in (("gen", 3600.0, "window.clock_stepped"),
                          ("api", -7200.0, "window.sealed_before_open")):  # fmt: skip
        L.start(skew_s=skew)
        try:
            sealed = L.seal(t, opened[t], feed(t, 40, skew))
            out = L.verify_seal(sealed.seal_json, t)
        finally:
            L.stop()
        content = content_of(sealed.seal_json)
        assert (sealed.held, out.returncode) == (False, 1), out.stdout
        assert finding_ids(content) == [want]
        assert f"finding {want}" in out.stdout
        assert content["seal"]["elapsed"]["same_boot"] is True
        assert content["seal"]["elapsed"]["boot_s"] < 120


# ------------------------------------------------------------------ seals made before these checks


def old(name: str) -> dict[str, Any]:
    pub = keys.load_public_key(OLD / "verifier.pub")
    return check_seal((OLD / f"{name}.seal.json").read_bytes(), pub).to_json()


def test_an_older_honest_seal_still_verifies_and_says_what_it_lacks() -> None:
    r = old("honest")
    assert (r["ok"], r["problems"]) == (True, [])
    lacks = " ".join(r["not_checked"])
    assert "the window's length on the verifier's boot clock: the seal predates" in lacks
    assert "which processes run steps" in lacks
    assert "evidence: the same processes at the open and the seal" in r["checks"]


def test_older_held_seals_of_the_attacks_no_longer_verify() -> None:
    """The seals the verifier signed as held before these checks: a worker restarted in the
    window, and a window sealed two hours before it opened. verify-seal derives both from
    the signed content and refuses them."""
    r = old("restarted")
    assert not r["ok"] and r["held"] is True
    assert any("held, yet the seal's own evidence shows window.process_changed" in p
               and "pid 301" in p for p in r["problems"]), r["problems"]  # fmt: skip
    r = old("before_open")
    assert not r["ok"]
    assert any("s before the window opened" in p for p in r["problems"]), r["problems"]
