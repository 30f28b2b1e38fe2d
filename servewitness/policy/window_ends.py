"""A measurement window's two ends compared beyond the hooks (``policy/window.py``): are the
serving processes the same ones, did those that run steps run any, and do the verifier's
clocks say the seal came after the open? Judged by the verifier at the seal
(``server/windows.py``) and derived again offline from the seal's signed content by
``verifier audit verify-seal`` (``ledger/verify_seal.py``), so both read the same rows alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from servewitness.model import ProcessKey, ProcessReport
from servewitness.policy.interface import IGNORED_ROLES
from servewitness.policy.window import (
    WINDOW_CLOCK_STEPPED,
    WINDOW_EVIDENCE_UNLEDGERED,
    WINDOW_NO_STEPS,
    WINDOW_PROCESS_CHANGED,
    WINDOW_SEALED_BEFORE_OPEN,
    ProcessAt,
    WindowFinding,
    process_tag,
)

# ------------------------------------------------------------------ the window's processes
# A window's evidence rows (``server/windows.py``): per process of every judged target at one
# end, with ``target``, ``boot_id``, ``pid``, ``start_ticks``, ``role``, ``rank``, its step
# counts (``steps_total``, ``steps_productive``) and whether it runs steps (``runs_steps``).
Row = Mapping[str, Any]


def runs_steps(processes: tuple[ProcessReport, ...]) -> set[ProcessKey]:
    """The processes of one target whose steps a window counts: those the policy's liveness
    rules judge (``_evidence.steppers``: every worker, else every process with a live runner)."""
    from servewitness.policy import _evidence, interface

    snap = interface.TargetSnapshot("", processes, 0.0)
    return {p.key for p in _evidence.steppers(snap, interface.EvalContext(), "window")[0]}


def _serving(rows: Iterable[Row]) -> dict[ProcessAt, Row]:
    """ROWS by process identity: every process of the serving setup (helpers and unknown
    processes, such as a resource tracker or a compiler a kernel build starts, are not)."""
    return {
        (str(r["target"]), str(r["boot_id"]), int(r["pid"]), int(r["start_ticks"])): r
        for r in rows
        if r.get("role") not in IGNORED_ROLES or r.get("runs_steps") is True
    }


def _who(r: Row) -> str:
    rank = "" if r.get("rank") is None else f" rank {r['rank']}"
    return f"{r.get('role')}{rank} (pid {r['pid']})"


def _ident(r: Row) -> dict[str, Any]:
    return {k: r.get(k) for k in ("boot_id", "pid", "start_ticks", "role", "rank")}


def _slot(r: Row) -> tuple[str, str, int]:
    return str(r["target"]), str(r.get("role")), -1 if r.get("rank") is None else int(r["rank"])


def same_processes(at_open: Iterable[Row], at_seal: Iterable[Row]) -> list[WindowFinding]:
    """``window.process_changed`` for every process of the serving setup that is not the same
    one (target, boot id, pid, start ticks) at both ends: a whole target that joined or left
    the run, a process gone and a new one in its place (same target, role and rank: one
    restart, ``restarted`` and ``was`` in its context; another boot: ``rebooted``), a process
    gone, a process that appeared (an extra worker or API server is another serving setup)."""
    before, after = _serving(at_open), _serving(at_seal)
    found: list[WindowFinding] = []
    targets = ({k[0] for k in before}, {k[0] for k in after})
    for t, there, change, what in (
        *((t, after, "target_appeared", "was not among") for t in targets[1] - targets[0]),
        *((t, before, "target_gone", "has left") for t in targets[0] - targets[1]),
    ):
        procs = [_ident(r) for k, r in sorted(there.items()) if k[0] == t]
        found.append(
            WindowFinding(
                WINDOW_PROCESS_CHANGED,
                f"target {t} {what} the window's targets at its open ({len(procs)} "
                "process(es)): the serving setup changed during the window",
                {"target": t, "change": change, "processes": procs},
            )
        )
    both = targets[0] & targets[1]
    gone = [before[k] for k in sorted(before) if k not in after and k[0] in both]
    new = [after[k] for k in sorted(after) if k not in before and k[0] in both]
    for old in list(gone):
        now = next((n for n in new if _slot(n) == _slot(old)), None)
        if now is None:
            continue
        gone.remove(old)
        new.remove(now)
        boot = now["boot_id"] != old["boot_id"]
        found.append(
            WindowFinding(
                WINDOW_PROCESS_CHANGED,
                f"{old['target']}: {_who(old)} was replaced during the window by {_who(now)}"
                + (
                    f" on another boot of its host (boot {old['boot_id']} at the open, "
                    f"{now['boot_id']} at the seal)"
                    if boot
                    else f" (start ticks {old['start_ticks']}, then {now['start_ticks']})"
                )
                + ": its counts start again, and nothing shows what ran in between",
                {
                    "target": old["target"],
                    "change": "rebooted" if boot else "restarted",
                    "restarted": True,
                    "process": _ident(now),
                    "was": _ident(old),
                },
            )
        )
    for rows, change, what in (
        (gone, "gone", "reported at the window's open is gone at its seal"),
        (new, "appeared", "was not there at the window's open (another serving setup)"),
    ):
        found.extend(
            WindowFinding(
                WINDOW_PROCESS_CHANGED,
                f"{r['target']}: {_who(r)} {what}",
                {"target": r["target"], "change": change, "process": _ident(r)},
            )
            for r in rows
        )
    return found


def _tag(target: str, r: Mapping[str, Any]) -> str:
    """The ``target/pid P@START`` a hook row's key of process R starts with."""
    key = ProcessKey(str(r["boot_id"]), int(r["pid"]), int(r["start_ticks"]))
    return f"{target}/{process_tag(key, key.pid)}"


def changed_tags(found: Iterable[WindowFinding]) -> set[str]:
    """The hook-row key prefixes (``target/pid P@START``) of the processes FOUND names as
    changed: their hook rows are not compared (``pace`` would say the same again, or compare
    counts across a reboot)."""
    out: set[str] = set()
    for f in found:
        if f.id != WINDOW_PROCESS_CHANGED or "target" not in f.context:
            continue
        c = f.context
        for r in [c.get("process"), c.get("was"), *c.get("processes", ())]:
            if isinstance(r, dict):
                out.add(_tag(str(c["target"]), r))
    return out


def without(rows: Mapping[str, Row], tags: set[str]) -> dict[str, Row]:
    """Hook ROWS but those of the processes TAGS names."""
    return {k: v for k, v in rows.items() if k.rsplit("/", 2)[0] not in tags}


def _counted(then: Row, now: Row) -> tuple[str, int, int] | None:
    """(what, at the open, at the seal) of a process's steps: productive where both ends
    counted them, else all steps (a window opened by an older verifier); None: not counted."""
    for name in ("steps_productive", "steps_total"):
        a, b = then.get(name), now.get(name)
        if type(a) is int and type(b) is int:
            return ("productive" if name == "steps_productive" else "engine"), a, b
    return None


def progress(
    at_open: Iterable[Row], at_seal: Iterable[Row], rows: Mapping[str, Row]
) -> list[WindowFinding] | None:
    """``window.no_steps`` for every process that runs steps at the seal, was there at the
    open, and ran no productive step in between (or whose steps are not counted); for a
    target with no process whose steps can be counted at either end. ROWS: the window's hook rows
    (``pace``), whose own no_steps is not said twice. None: the seal's rows do not say which
    processes run steps (a seal made before they did)."""
    seal_rows = list(at_seal)
    if any("runs_steps" not in r for r in seal_rows):
        return None
    before, after = _serving(at_open), _serving(seal_rows)
    idle = {k.rsplit("/", 2)[0] for k, r in rows.items() if int(r["steps"]) <= 0}
    found: list[WindowFinding] = []
    for t in sorted({k[0] for k in before} & {k[0] for k in after}):
        steppers = [k for k in sorted(after) if k[0] == t and after[k].get("runs_steps")]
        if not steppers and not any(r.get("runs_steps") for k, r in before.items() if k[0] == t):
            found.append(
                WindowFinding(
                    WINDOW_NO_STEPS,
                    f"{t}: no process runs steps the window could count (no worker, and no "
                    "process with a live runner): nothing shows the server worked",
                    {"target": t},
                )
            )
        for k in steppers:
            if k not in before or _tag(t, after[k]) in idle:
                continue  # a new process (process_changed), or said by its hook's row
            counted = _counted(before[k], after[k])
            if counted is not None and counted[2] > counted[1]:
                continue
            what = (
                "its steps are not counted (no probe, or not at the open)"
                if counted is None
                else f"{counted[1]} {counted[0]} steps at the open and {counted[2]} at the seal"
            )
            found.append(
                WindowFinding(
                    WINDOW_NO_STEPS,
                    f"{t}: {_who(after[k])} ran no productive step during the window ({what}): "
                    "an idle window proves nothing",
                    {
                        "target": t,
                        "process": _ident(after[k]),
                        "steps_at_open": None if counted is None else counted[1],
                        "steps_at_seal": None if counted is None else counted[2],
                    },
                )
            )
    return found


# ------------------------------------------------------------------ the window's times
# How far the window's length on the verifier's wall clock may be from its length on its boot
# clock before the wall clock counts as stepped: NTP slews at most 500 ppm, and the two
# readings at each end are a few calls apart.
CLOCK_TOLERANCE_S = 2.0
CLOCK_DRIFT = 0.001


def verifier_clock(boot_id: str | None, boottime_s: float, clock: str) -> dict[str, Any]:
    """The verifier's clocks at one end of a window, signed in its content: its host's boot id
    (None: not known) and the reading of its boot clock (CLOCK, ``server/clock.NAME``)."""
    return {"boot_id": boot_id, "boottime_s": boottime_s, "clock": clock}


def clock_shape(c: object) -> TypeGuard[dict[str, Any]]:
    """C is a ``verifier_clock`` as written above."""
    return (
        isinstance(c, dict)
        and set(c) == {"boot_id", "boottime_s", "clock"}
        and (c["boot_id"] is None or isinstance(c["boot_id"], str))
        and type(c["boottime_s"]) in (int, float)
        and isinstance(c["clock"], str)
    )


def elapsed(
    opened_unix: float,
    sealed_unix: float,
    at_open: Mapping[str, Any] | None,
    at_seal: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], list[WindowFinding]]:
    """The window's length on the wall clock and, where the verifier's host did not boot again
    between the open and the seal, on its boot clock (the seal's ``elapsed``: ``same_boot``
    None when the open recorded no clock or a boot id is unknown), and what is wrong with it:
    a seal dated before its open, or the two lengths apart by more than the tolerance."""
    wall = round(sealed_unix - opened_unix, 6)
    same: bool | None = None
    boot: float | None = None
    if (
        at_open is not None
        and at_seal is not None
        and at_open["clock"] == at_seal["clock"]
        and at_open["boot_id"] is not None
        and at_seal["boot_id"] is not None
    ):
        same = at_open["boot_id"] == at_seal["boot_id"]
        if same:
            boot = round(at_seal["boottime_s"] - at_open["boottime_s"], 6)
    summary = {"wall_s": wall, "boot_s": boot, "same_boot": same}
    on_boot = "" if boot is None else f"; on its boot clock the window lasted {boot:.1f} s"
    if wall < 0:
        return summary, [
            WindowFinding(
                WINDOW_SEALED_BEFORE_OPEN,
                f"the seal is dated {-wall:.1f} s before the window's open (the verifier's wall "
                f"clock was stepped back in between{on_boot}): its times are not the window's",
                summary,
            )
        ]
    if boot is not None and abs(wall - boot) > max(CLOCK_TOLERANCE_S, CLOCK_DRIFT * abs(boot)):
        return summary, [
            WindowFinding(
                WINDOW_CLOCK_STEPPED,
                f"the window lasted {wall:.1f} s by the verifier's wall clock{on_boot}: the "
                "wall clock was stepped during the window, so its times are not the window's",
                summary,
            )
        ]
    return summary, []


# ------------------------------------------------------------------ derived again offline


@dataclass
class Recheck:
    """What ``verify-seal`` makes of a seal's times, processes and steps (``recheck``)."""

    problems: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)


def _number(x: object) -> TypeGuard[float]:
    return type(x) in (int, float)


def recheck(w: Mapping[str, Any], sl: Mapping[str, Any]) -> Recheck:
    """The window content W and the seal content SL of a seal, judged again as the verifier
    judged them at the seal: its times (``_times``) and, for a held seal, its processes and
    steps (``_ends``). What an older seal does not record is said, not failed."""
    out = Recheck()
    _times(w, sl, out)
    _ends(w, sl, out)
    return out


def _times(w: Mapping[str, Any], sl: Mapping[str, Any], out: Recheck) -> None:
    """The seal is not dated before its open; its ``elapsed`` recomputes from the verifier's
    clocks recorded at each end, and the findings they call for are the seal's."""
    opened, sealed = w.get("opened_unix"), sl.get("sealed_unix")
    if not (_number(opened) and _number(sealed)):
        out.problems.append("the window's or the seal's time is missing or not a number")
        return
    if sealed < opened:
        out.problems.append(
            f"the seal is dated {opened - sealed:.1f} s before the window opened "
            "(sealed_unix before opened_unix): a window cannot close before it opens"
        )
    at_open, at_seal, span = w.get("verifier_clock"), sl.get("verifier_clock"), sl.get("elapsed")
    if at_seal is None and span is None and at_open is None:
        out.not_checked.append(
            "the window's length on the verifier's boot clock: the seal predates recording it "
            "(only its wall-clock times relate the open and the seal)"
        )
        return
    if not clock_shape(at_seal) or not (at_open is None or clock_shape(at_open)):
        out.problems.append("the verifier's clock recorded at the open or the seal is malformed")
        return
    summary, due = elapsed(opened, sealed, at_open, at_seal)
    if span != summary:
        out.problems.append(
            f"the seal's elapsed times {span!r} do not recompute from its clocks ({summary})"
        )
    named = {f.get("id") for f in sl.get("findings") or () if isinstance(f, dict)}
    out.problems += [
        f"the seal does not name {f.id} though its clocks show it: {f.message}"
        for f in due
        if f.id not in named
    ]
    if summary["same_boot"] is True:
        out.checks.append(
            f"times: sealed {summary['wall_s']:.1f} s after the open by the verifier's wall "
            f"clock, {summary['boot_s']:.1f} s by its boot clock"
        )
        return
    why = (
        "the verifier's host booted again between the open and the seal"
        if summary["same_boot"] is False
        else "the window was opened by a verifier that did not record its clock"
    )
    out.not_checked.append(
        f"the window's length on a clock that cannot be stepped: {why} (by its wall clock the "
        f"seal came {summary['wall_s']:.1f} s after the open)"
    )


def unledgered(at_open: Iterable[Row], at_seal: Iterable[Row]) -> list[WindowFinding]:
    """``window.evidence_unledgered`` for each report the window's evidence rests on, at
    either end, that has no ledger entry (``ledger_seq`` null): written into the database
    behind the ledger's back, so no agent is known to have sent it."""
    out: list[WindowFinding] = []
    seen: set[tuple[str, Any, Any]] = set()
    for end, rows in (("open", at_open), ("seal", at_seal)):
        for r in rows:
            at = (end, r.get("agent_id"), r.get("report_seq"))
            if isinstance(r.get("ledger_seq"), int) or at in seen:
                continue
            seen.add(at)
            out.append(
                WindowFinding(
                    WINDOW_EVIDENCE_UNLEDGERED,
                    f"the evidence at the {end} is report {r.get('report_seq')} of agent "
                    f"{r.get('agent_id')}, which has no ledger entry: a row written into the "
                    "database behind the ledger's back, not known to be an agent's",
                    {"end": end, "agent_id": r.get("agent_id"), "report_seq": r.get("report_seq")},
                )
            )
    return out


def _ends(w: Mapping[str, Any], sl: Mapping[str, Any], out: Recheck) -> None:
    """A held seal's own evidence at both ends shows the same processes, each process that
    runs steps stepped, and each report it rests on has its ledger entry."""
    try:
        opened, sealed = list(w["evidence"]), list(sl["evidence"])
        due = same_processes(opened, sealed) + unledgered(opened, sealed)
        steps = progress(opened, sealed, dict(sl.get("hooks") or {}))
    except (KeyError, TypeError, ValueError, AttributeError):
        out.problems.append("the evidence of the window or the seal is malformed")
        return
    if steps is None:
        out.not_checked.append(
            "that each process that runs steps stepped during the window, from the seal's "
            "evidence: the seal predates recording which processes run steps"
        )
    due += steps or []
    if sl.get("held") is True and due:
        shown = "; ".join(f"{f.id}: {f.message}" for f in due[:3])
        more = f" (and {len(due) - 3} more)" if len(due) > 3 else ""
        out.problems.append(f"held, yet the seal's own evidence shows {shown}{more}")
    elif not due:
        out.checks.append(
            "evidence: the same processes at the open and the seal"
            + ("" if steps is None else ", each process that runs steps stepped")
        )
