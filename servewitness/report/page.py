"""One :class:`~servewitness.report.model.Report` as one self-contained HTML page: inline CSS,
inline SVG, no script, nothing loaded from anywhere (its Content-Security-Policy forbids both,
should an escaped value ever not be). Sections: the verdict, what the page could not show,
the verdict over time, every target's liveness with each process's (each rank's) timeline of
steps and hook fires, provenance by origin, the findings, and the measurement windows."""

from __future__ import annotations

from collections.abc import Sequence

from servewitness.report import svg
from servewitness.report.escape import num, seconds, text, when
from servewitness.report.model import FindingRow, ProcessView, Report, TargetView, WindowView

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
    "form-action 'none'"
)
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#212121;
background:#fff}
main{max-width:1000px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;margin:6px 0;width:100%}
th,td{border:1px solid #e0e0e0;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f5f5f5;font-weight:600}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;word-break:break-all}
.verdict{display:inline-block;padding:4px 14px;border-radius:4px;color:#fff;font-weight:700;
font-size:20px;letter-spacing:.5px}
.v{display:inline-block;padding:0 6px;border-radius:3px;color:#fff;font-weight:600}
.PASS{background:#2e7d32}.FAIL{background:#c62828}.PENDING{background:#f9a825;color:#212121}
.STALE{background:#757575}.NONE{background:#9e9e9e}
.banner{border:2px solid #c62828;background:#ffebee;padding:8px 12px;margin:10px 0}
.note{border-left:4px solid #90a4ae;background:#f5f7f8;padding:6px 12px;margin:10px 0}
.sev-error{color:#c62828;font-weight:600}.sev-pending{color:#a66f00;font-weight:600}
.sev-warning{color:#ef6c00}.meta{color:#616161}
svg.chart{max-width:100%;height:auto;display:block;margin:4px 0}
svg .ax,svg .lg{font:11px system-ui,sans-serif;fill:#424242}
"""
ORIGINS = {
    "pristine": "installed, bytes match the distribution's RECORD",
    "patched": "installed, bytes differ from RECORD",
    "editable": "editable or local install",
    "generated": "compile cache or temporary directory",
    "stdlib": "the interpreter's standard library",
    "unknown": "no distribution claims it",
    "added": "in a distribution's folder, not in its RECORD",
    "self": "the verifier's own probe",
}


def _badge(verdict: str, big: bool = False) -> str:
    v = verdict if verdict in svg.VERDICT_COLOURS else "NONE"
    label = text(verdict, 20) if verdict else "no verdict"
    return f'<span class="{"verdict" if big else "v"} {v}">{label}</span>'


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """HEAD and ROWS are HTML already (escaped by the caller)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in
                  enumerate(r))
        + "</tr>"
        for r in rows
    )  # fmt: skip
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _header(r: Report) -> str:
    flags = (
        f'<div class="banner"><b>UNSAFE policy settings:</b> '
        f"{text('; '.join(r.unsafe_flags))}</div>"
        if r.unsafe_flags
        else ""
    )
    bad = ""
    if r.mismatches:
        items = "".join(f"<li>{text(x)}</li>" for x in r.mismatches[:20])
        more = f"<li>and {len(r.mismatches) - 20} more</li>" if len(r.mismatches) > 20 else ""
        bad = (
            '<div class="banner"><b>LEDGER MISMATCH:</b> stored records this page would show '
            "differ from their ledger entries; they are left out. `verifier audit verify --db` "
            f"lists every difference.<ul>{items}{more}</ul></div>"
        )
    return (
        f"<header><h1>Run <code>{text(r.run)}</code> {_badge(r.verdict, big=True)}</h1>"
        f'<div class="meta">verdict as of {text(when(r.verdict_unix))}; policy '
        f"<code>{text(r.policy_digest)}</code>"
        + (f" from <code>{text(r.source)}</code>" if r.source else "")
        + f"; registered {text(when(r.created_unix))}<br>read from "
        f"{text(', '.join(r.sources))} at {text(when(r.generated_unix))}</div></header>"
        + bad
        + flags
    )


def _why(r: Report) -> str:
    """Under a verdict that is not PASS, the findings that make it so, first."""
    severity = {"FAIL": "error", "PENDING": "pending", "STALE": "pending"}.get(r.verdict)
    why = [f for f in r.findings if f.severity == severity]
    if not why:
        return ""
    items = "".join(
        f"<li><code>{text(f.id)}</code> in "
        + (f"<code>{text(f.target)}</code>" if f.target else "the run")
        + (f": {text(f.message)}" if f.message else "")
        + "</li>"
        for f in why[:10]
    )
    more = f"<li>and {len(why) - 10} more (Findings, below)</li>" if len(why) > 10 else ""
    return f'<div class="banner"><b>Why {text(r.verdict)}:</b><ul>{items}{more}</ul></div>'


def _notes(r: Report) -> str:
    if not r.notes:
        return ""
    items = "".join(f"<li>{text(n, 0)}</li>" for n in r.notes)
    return f'<div class="note"><b>What this page does not show in full</b><ul>{items}</ul></div>'


def _history(r: Report) -> str:
    if not r.history:
        return ""
    rows = [[text(when(t)), _badge(v)] for t, v in reversed(r.history)]
    return (
        "<section><h2>Verdict over time</h2>"
        + svg.history(r.history, r.generated_unix)
        + f"<details><summary>{len(r.history)} verdict change(s)</summary>"
        + _table(["since", "verdict"], rows)
        + "</details></section>"
    )


def _liveness(targets: Sequence[TargetView]) -> str:
    rows = [
        [
            f'<a href="#t{i}"><code>{text(t.target)}</code></a>',
            _badge(t.verdict),
            text(t.state or "-"),
            text(when(t.last_report_unix)),
            text(seconds(t.age_s)),
            f"<code>{text(t.agent_id or '-')}</code>",
            num(t.reports) if t.reports else "-",
            num(t.processes_total),
        ]
        for i, t in enumerate(targets)
    ]
    return _table(
        ["target", "verdict", "state", "last report", "age", "agent", "reports stored",
         "processes"],
        rows,
        (6, 7),
    )  # fmt: skip


def _who(rank: int | None, role: str, pid: int) -> str:
    return f"{f'rank {rank} ' if rank is not None else ''}{role} pid {pid}"


def _process(p: ProcessView, t0: float, t1: float) -> str:
    label = _who(p.rank, p.role, p.pid)
    meta = []
    if p.runner:
        meta.append(f"runner <code>{text(p.runner)}</code>")
    if p.container_id:
        meta.append(f"container <code>{text(p.container_id, 12)}</code>")
    if p.first_unix is not None:
        meta.append(f"seen {text(when(p.first_unix))} .. {text(when(p.last_unix))}")
    out = f"<h4>{text(label)}</h4>"
    if meta:
        out += f'<div class="meta">{"; ".join(meta)}</div>'
    if p.hooks:
        out += _table(
            ["hook", "judged on", "fired on judged steps", "judged steps", "min per step",
             "fired in all"],
            [[f"<code>{text(h.name)}</code>", text(h.on), num(h.judged_fired),
              num(h.judged_steps), num(h.min_per_step) if h.min_per_step else "-", num(h.fired)]
             for h in p.hooks],
            (2, 3, 4, 5),
        )  # fmt: skip
    if p.samples:
        out += svg.timeline(p.samples, t0, t1, label)
    return out


def _targets(r: Report) -> str:
    if not r.targets:
        return "<section><h2>Targets</h2><p>No target reported for this run.</p></section>"
    out = ["<section><h2>Targets and liveness</h2>", _liveness(r.targets)]
    for i, t in enumerate(r.targets):
        out.append(f'<h3 id="t{i}">Target <code>{text(t.target)}</code> {_badge(t.verdict)}</h3>')
        times = [s.at_unix for p in t.processes for s in p.samples]
        t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
        if not t.processes:
            out.append("<p>No process of it was judged or reported.</p>")
        out += [_process(p, t0, t1) for p in t.processes]
        if t.processes_total > len(t.processes):
            out.append(f"<p>{t.processes_total - len(t.processes)} more process(es) not shown.</p>")
    out.append("</section>")
    return "".join(out)


def _provenance(r: Report) -> str:
    procs = [(t, p) for t in r.targets for p in t.processes if p.origins or p.files]
    if not r.origins and not procs:
        return ""
    total = sum(n for _, n in r.origins if isinstance(n, int))
    rows = [[text(o), text(ORIGINS.get(o, "")), num(n)] for o, n in r.origins if n]
    out = [
        "<section><h2>Provenance by origin</h2>",
        f"<p>{num(total)} loaded file(s) over the latest report of every process shown.</p>",
        svg.bars(r.origins),
        _table(["origin", "meaning", "files"], rows, (2,)),
    ]
    for t, p in procs:
        if not p.files:
            continue
        rank = f" rank {p.rank}" if p.rank is not None else ""
        out.append(
            f"<h4>Not pristine in <code>{text(t.target)}</code> pid {p.pid}{rank} "
            f"({num(p.files_total)})</h4>"
        )
        out.append(
            _table(
                ["origin", "path", "why"],
                [[text(f.origin), f"<code>{text(f.path)}</code>", text(f.reason)] for f in p.files],
            )
        )
        if p.files_total > len(p.files):
            out.append(f"<p>{p.files_total - len(p.files)} more file(s) not shown.</p>")
    out.append("</section>")
    return "".join(out)


def _findings_table(findings: Sequence[FindingRow]) -> str:
    rows = [
        [
            f'<span class="sev-{text(f.severity, 10)}">{text(f.severity or "-")}</span>',
            f"<code>{text(f.id)}</code>",
            f"<code>{text(f.target)}</code>" if f.target else "(run)",
            text(f.message or "-", 0 if len(f.message) < 4000 else 4000),
        ]
        for f in findings
    ]
    return _table(["severity", "finding", "target", "what"], rows)


def _findings(r: Report) -> str:
    if not r.findings:
        return "<section><h2>Findings</h2><p>No findings.</p></section>"
    return f"<section><h2>Findings ({len(r.findings)})</h2>{_findings_table(r.findings)}</section>"


def _window(w: WindowView) -> str:
    state = "open (not sealed)" if w.sealed_unix is None else "held" if w.held else "BROKEN"
    out = [
        f"<h3>Window <code>{text(w.window_id)}</code>: {text(state)}</h3>",
        f'<div class="meta">opened {text(when(w.opened_unix))}'
        + (
            f" ({text(w.verdict_at_open)}), sealed {text(when(w.sealed_unix))} "
            f"({text(w.verdict_at_seal)}); results <code>{text(w.results_name)}</code> sha256 "
            f"<code>{text(w.results_sha256)}</code>"
            if w.sealed_unix is not None
            else ""
        )
        + "</div>",
    ]
    if w.hooks:
        out.append(
            _table(
                ["hook", "process", "judged on", "fired during the window", "judged steps"],
                [[f"<code>{text(h.name)}</code>", text(_who(h.rank, h.role, h.pid)), text(h.on),
                  num(h.fired), num(h.steps)] for h in w.hooks],
                (3, 4),
            )
        )  # fmt: skip
    if w.findings:
        out.append(_findings_table(w.findings))
    return "".join(out)


def _windows(r: Report) -> str:
    if not r.windows:
        return ""
    sealed = sum(1 for w in r.windows if w.sealed_unix is not None)
    return (
        f"<section><h2>Measurement windows ({len(r.windows)}, {sealed} sealed)</h2>"
        + "".join(_window(w) for w in r.windows)
        + "</section>"
    )


def render(r: Report) -> str:
    """R as one HTML document (UTF-8 text)."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>verifier report: run {text(r.run, 80)} {text(r.verdict or 'no verdict')}"
        f"</title><style>{CSS}</style></head><body><main>"
        + _header(r)
        + _why(r)
        + _notes(r)
        + _history(r)
        + _targets(r)
        + _provenance(r)
        + _findings(r)
        + _windows(r)
        + '<footer class="meta"><p>Generated by <code>verifier report</code>. This page '
        "holds no script and loads nothing.</p></footer></main></body></html>\n"
    )
