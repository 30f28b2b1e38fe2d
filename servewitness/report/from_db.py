"""A run's report read from a verifier's database (opened read-only by the caller, inside one
snapshot): its registration and verdict history, the findings of its latest verdict, every
target it covers with a timeline of its processes' steps and hook fires (at most
``MAX_SAMPLES`` stored reports per target, evenly spread, the latest always), their provenance
counts by origin, and its measurement windows with their seals.

Every report, window and seal it shows is checked against its own ledger entry; one that
disagrees is named in :attr:`Report.mismatches` (the page says so first), never shown as
good. A stored value of the wrong type raises ``ValueError``/``TypeError``, which the caller
explains as a corrupt database.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from servewitness import wire
from servewitness.errors import NotFound
from servewitness.ledger import chain
from servewitness.ledger.content_check import check_content
from servewitness.ledger.interface import Database
from servewitness.model import ProcessReport, TargetReport
from servewitness.policy import PolicyError, load_policy, unsafe_flags
from servewitness.policy.findings import FINDINGS
from servewitness.report import model as m


def gather(db: Database, run: str, now: float, name: str) -> m.Report:
    """RUN's report from DB (NAME: how the page names the database); NotFound for no run."""
    row = db.execute(
        "SELECT policy_toml, policy_digest, source, created_unix FROM runs WHERE name = ?", (run,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no run named {run!r} in {name}")
    toml, digest, source, created = str(row[0]), str(row[1]), str(row[2]), float(row[3])
    notes: list[str] = []
    selects = None
    flags: tuple[str, ...] = ()
    try:
        policy = load_policy(toml, f"run {run}")
        selects, flags = policy.selects, tuple(unsafe_flags(policy))
    except PolicyError as e:
        notes.append(f"the run's stored policy does not load here: {e}")
    history, total, detail = _history(db, run)
    if total > len(history):
        notes.append(f"verdict history: the latest {len(history)} of {total} changes shown")
    verdict = history[-1][1] if history else ""
    judged: dict[str, Any] = detail.get("targets") or {}
    names = set(judged) | _covered(db, selects)
    mismatches: list[str] = []
    targets = []
    for t in sorted(names)[: m.MAX_TARGETS]:
        targets.append(_target(db, t, judged.get(t), now, notes, mismatches))
    if len(names) > m.MAX_TARGETS:
        notes.append(f"targets: the first {m.MAX_TARGETS} of {len(names)} shown (by name)")
    windows = _windows(db, run, notes, mismatches)
    return m.Report(
        run=run,
        verdict=verdict,
        policy_digest=digest,
        source=source,
        created_unix=created,
        verdict_unix=history[-1][0] if history else None,
        history=tuple(history),
        findings=_findings(detail, notes),
        targets=tuple(targets),
        windows=windows,
        origins=_totals(p.origins for t in targets for p in t.processes),
        unsafe_flags=flags,
        sources=(f"database {name}",),
        notes=(
            *notes,
            "findings: the ids the verifier stored with the verdict; what each means is the "
            "finding catalogue's (`--verifier` shows each finding's own message)",
        ),
        mismatches=tuple(mismatches),
        generated_unix=now,
    )


def _history(db: Database, run: str) -> tuple[list[tuple[float, str]], int, dict[str, Any]]:
    """The latest MAX_HISTORY verdict changes (oldest first), how many there are, and the
    latest one's stored detail."""
    (total,) = db.execute("SELECT COUNT(*) FROM verdicts WHERE run = ?", (run,)).fetchone()
    rows = db.execute(
        "SELECT at_unix, verdict, detail_json FROM verdicts WHERE run = ? "
        "ORDER BY rowid DESC LIMIT ?",
        (run, m.MAX_HISTORY),
    ).fetchall()
    detail: dict[str, Any] = json.loads(rows[0][2]) if rows else {}
    if not isinstance(detail, dict):
        raise TypeError(f"verdict detail of run {run!r} is not an object")
    return [(float(t), str(v)) for t, v, _ in reversed(rows)], int(total), detail


def _finding(fid: object, target: str) -> m.FindingRow:
    kind = FINDINGS.get(str(fid))
    if kind is None:
        return m.FindingRow(str(fid), "", "", target)
    return m.FindingRow(str(fid), kind.severity.value, kind.meaning, target)


def _findings(detail: dict[str, Any], notes: list[str]) -> tuple[m.FindingRow, ...]:
    rows = [_finding(f, "") for f in detail.get("run") or ()]
    for target, judged in sorted((detail.get("targets") or {}).items()):
        ids = judged[1] if isinstance(judged, list) and len(judged) > 1 else ()
        rows += [_finding(f, str(target)) for f in ids]
    if len(rows) > m.MAX_FINDINGS:
        notes.append(f"findings: the first {m.MAX_FINDINGS} of {len(rows)} shown")
    return tuple(rows[: m.MAX_FINDINGS])


def _covered(db: Database, selects: Any) -> set[str]:
    """The stored targets the run's policy selects (none when it does not load)."""
    if selects is None:
        return set()
    containers: dict[str, set[str]] = {}
    for t, c in db.execute("SELECT DISTINCT target, container_id FROM processes"):
        containers.setdefault(str(t), set()).update([str(c)] if c else [])
    for (t,) in db.execute("SELECT DISTINCT target FROM reports"):
        containers.setdefault(str(t), set())
    return {t for t, cs in containers.items() if selects(t, tuple(sorted(cs)))}


def _sample_keys(db: Database, target: str) -> tuple[list[tuple[str, int, float]], int]:
    """At most MAX_SAMPLES stored reports of TARGET, evenly spread in time, the first and
    the latest always: (agent id, seq, received), oldest first; and how many are stored."""
    (total,) = db.execute("SELECT COUNT(*) FROM reports WHERE target = ?", (target,)).fetchone()
    total = int(total)
    # every STEP-th from the first, and the latest: at most MAX_SAMPLES in all
    step = max(1, -(-(total - 1) // max(1, m.MAX_SAMPLES - 1)))
    rows = db.execute(
        "SELECT agent_id, seq, received_unix FROM (SELECT agent_id, seq, received_unix, "
        "ROW_NUMBER() OVER (ORDER BY received_unix, rowid) AS n FROM reports WHERE target = ?) s "
        "WHERE (n - 1) % ? = 0 OR n = ? ORDER BY n",
        (target, step, total),
    ).fetchall()
    return [(str(a), int(s), float(t)) for a, s, t in rows], total


@dataclass
class _Proc:
    report: ProcessReport
    first: float
    last: float
    samples: list[m.Sample] = field(default_factory=list)


def _target(  # noqa: PLR0917 - the target, and where its notes and mismatches go
    db: Database, target: str, judged: Any, now: float, notes: list[str], mismatches: list[str]
) -> m.TargetView:
    keys, total = _sample_keys(db, target)
    differences = check_content(db, reports=[(a, s) for a, s, _ in keys])
    mismatches += [str(d) for d in differences]
    bad = {d.key for d in differences}
    procs: dict[tuple[str, int, int], _Proc] = {}
    agent = ""
    for a, s, at in keys:
        if chain.report_ref(a, s) in bad:
            continue
        body = db.execute(
            "SELECT report FROM reports WHERE agent_id = ? AND seq = ?", (a, s)
        ).fetchone()
        try:
            report: TargetReport = wire.report_from_bytes(bytes(body[0]))
        except wire.WireError as e:  # ledgered as it is, yet unreadable here: said, not shown
            mismatches.append(f"reports {chain.report_ref(a, s)}: cannot be read ({e.explain()})")
            continue
        agent = a
        for p in report.processes:
            k = (p.key.boot_id, p.key.pid, p.key.start_ticks)
            got = procs.setdefault(k, _Proc(p, at, at))
            got.report, got.last = p, at
            if p.steps is not None:
                hooks = tuple((h.name, h.fired) for h in p.hooks)
                got.samples.append(m.Sample(at, p.steps.total, p.steps.productive, hooks))
    if total > len(keys):
        notes.append(f"target {target}: timeline of {len(keys)} of its {total} stored reports")
    ordered = sorted(procs.values(), key=lambda x: (x.report.rank is None, x.report.rank or 0,
                                                   x.report.role, x.report.key.pid))  # fmt: skip
    if len(ordered) > m.MAX_PROCESSES:
        notes.append(f"target {target}: {m.MAX_PROCESSES} of its {len(ordered)} processes shown")
    verdict = str(judged[0]) if isinstance(judged, list) and judged else ""
    return m.TargetView(
        target=target,
        verdict=verdict,
        state=_state(db, target),
        last_report_unix=keys[-1][2] if keys else None,
        age_s=now - keys[-1][2] if keys else None,  # when the page was made
        agent_id=agent,
        reports=total,
        processes=tuple(_process(p) for p in ordered[: m.MAX_PROCESSES]),
        processes_total=len(ordered),
    )


def _state(db: Database, target: str) -> str:
    row = db.execute(
        "SELECT event FROM target_events WHERE target = ? ORDER BY rowid DESC LIMIT 1", (target,)
    ).fetchone()
    return "" if row is None else str(row[0])


def _process(p: _Proc) -> m.ProcessView:
    r = p.report
    prov = r.provenance
    files = () if prov is None else prov.files
    steps = r.steps
    hooks = tuple(
        m.HookRow(h.name, h.fired, "productive", h.fired_productive,
                  0 if steps is None else steps.productive, 0.0)
        for h in r.hooks
    )  # fmt: skip
    return m.ProcessView(
        pid=r.key.pid,
        role=r.role,
        rank=r.rank,
        container_id=r.container_id,
        runner=None if r.runner is None else r.runner.cls,
        first_unix=p.first,
        last_unix=p.last,
        samples=tuple(p.samples),
        hooks=hooks,
        origins=() if prov is None else tuple(prov.counts),
        files=tuple(m.FileRow(f.origin, f.path, f.reason) for f in files[: m.MAX_FILES]),
        files_total=len(files),
    )


def _totals(counts: Iterable[tuple[tuple[str, int], ...]]) -> tuple[tuple[str, int], ...]:
    out: dict[str, int] = {}
    for each in counts:
        for origin, n in each:
            out[origin] = out.get(origin, 0) + int(n)
    return tuple(out.items())


def _ledgered(db: Database, kind: str, ref: str, subject: str) -> bool:
    row = db.execute(
        "SELECT subject FROM ledger WHERE kind = ? AND ref = ?", (kind, ref)
    ).fetchone()
    return row is not None and str(row[0]) == subject


def _windows(
    db: Database, run: str, notes: list[str], mismatches: list[str]
) -> tuple[m.WindowView, ...]:
    (total,) = db.execute("SELECT COUNT(*) FROM windows WHERE run = ?", (run,)).fetchone()
    rows = db.execute(
        "SELECT id, opened_unix, content_json FROM windows WHERE run = ? ORDER BY rowid DESC "
        "LIMIT ?",
        (run, m.MAX_WINDOWS),
    ).fetchall()
    if int(total) > len(rows):
        notes.append(f"windows: the latest {len(rows)} of {total} shown")
    out = []
    for row in reversed(rows):
        wid, opened, content = str(row[0]), float(row[1]), str(row[2])
        if not _ledgered(db, "window", wid, chain.window_subject(content)):
            mismatches.append(f"windows {wid}: differs from its ledger entry (or has none)")
            continue
        seal = db.execute(
            "SELECT sealed_unix, content_json FROM seals WHERE window_id = ?", (wid,)
        ).fetchone()
        if seal is None:
            out.append(m.WindowView(wid, opened))
            continue
        sealed = str(seal[1])
        if not _ledgered(db, "seal", wid, chain.seal_subject(sealed)):
            mismatches.append(f"seals {wid}: differs from its ledger entry (or has none)")
            continue
        out.append(_window(wid, opened, json.loads(sealed)))
    return tuple(out)


def _window(wid: str, opened: float, s: dict[str, Any]) -> m.WindowView:
    results = s.get("results") or {}
    return m.WindowView(
        window_id=wid,
        opened_unix=opened,
        sealed_unix=float(s["sealed_unix"]),
        held=bool(s["held"]),
        verdict_at_open=str(s.get("verdict_at_open", "")),
        verdict_at_seal=str(s.get("verdict_at_seal", "")),
        results_name=str(results.get("name", "")),
        results_sha256=str(results.get("sha256", "")),
        findings=tuple(
            m.FindingRow(str(f.get("id")), "error", str(f.get("message", "")))
            for f in s.get("findings") or ()
        ),
        hooks=tuple(
            m.WindowHook(
                str(h["name"]),
                int(h["pid"]),
                str(h["role"]),
                None if h.get("rank") is None else int(h["rank"]),
                str(h["on"]),
                int(h["fired"]),
                int(h["steps"]),
            )
            for h in (s.get("hooks") or {}).values()
        ),
    )
