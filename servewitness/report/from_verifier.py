"""A run's report from what a live verifier answers: the run's current verdict with every
finding's own message, every target's liveness (its latest report, how old, who sent it) and
every policy hook's counts per process. A verifier answers no history: the timeline, the
provenance counts and the windows come from its database (``--db``), and the page says so."""

from __future__ import annotations

from collections.abc import Sequence

from servewitness import wire
from servewitness.model import Finding, HookCount, RunVerdict
from servewitness.policy.window import judged_counts
from servewitness.report import model as m


def _finding(f: Finding, target: str) -> m.FindingRow:
    return m.FindingRow(f.id, f.severity.value, f.message, target)


def _processes(hooks: Sequence[HookCount]) -> tuple[m.ProcessView, ...]:
    by: dict[tuple[int, str], tuple[int | None, list[m.HookRow]]] = {}
    for h in hooks:
        fired, steps = judged_counts(h)
        row = m.HookRow(h.name, h.fired, h.on, fired, steps, h.min_fires_per_step)
        by.setdefault((h.pid, h.role), (h.rank, []))[1].append(row)
    return tuple(
        m.ProcessView(pid=pid, role=role, rank=rank, hooks=tuple(rows))
        for (pid, role), (rank, rows) in sorted(
            by.items(), key=lambda kv: (kv[1][0] is None, kv[1][0] or 0, kv[0])
        )
    )


def gather(
    verdict: RunVerdict,
    targets: Sequence[wire.TargetStatus],
    summary: wire.RunSummary | None,
    now: float,
    name: str,
) -> m.Report:
    """The report of VERDICT's run from a verifier (NAME: its address): TARGETS as
    ``ListTargets`` answered, SUMMARY its ``ListRuns`` line (None: not listed)."""
    status = {t.target: t for t in targets}
    findings = [_finding(f, "") for f in verdict.findings]
    views = []
    for tv in verdict.targets[: m.MAX_TARGETS]:
        findings += [_finding(f, tv.target) for f in tv.findings]
        st = status.get(tv.target)
        procs = _processes(tv.hooks)
        views.append(
            m.TargetView(
                target=tv.target,
                verdict=tv.verdict.value,
                state="" if st is None else st.state,
                last_report_unix=tv.report_unix if st is None else st.last_report_unix,
                age_s=None if st is None else st.age_s,
                agent_id="" if st is None else st.agent_id,
                processes=procs[: m.MAX_PROCESSES],
                processes_total=len(procs),
            )
        )
    notes = [m.WITHOUT_DB]
    if len(verdict.targets) > m.MAX_TARGETS:
        notes.append(f"targets: the first {m.MAX_TARGETS} of {len(verdict.targets)} shown")
    if len(findings) > m.MAX_FINDINGS:
        notes.append(f"findings: the first {m.MAX_FINDINGS} of {len(findings)} shown")
    return m.Report(
        run=verdict.run,
        verdict=verdict.verdict.value,
        policy_digest=verdict.policy_digest,
        created_unix=None if summary is None else summary.created_unix,
        verdict_unix=verdict.evaluated_unix,
        findings=tuple(findings[: m.MAX_FINDINGS]),
        targets=tuple(views),
        unsafe_flags=() if summary is None else tuple(summary.unsafe_flags),
        sources=(f"verifier {name}",),
        notes=tuple(notes),
        generated_unix=now,
    )
