"""The page's charts, as inline SVG (no script, no external font or image): a process's step
and hook-fire counters over time, a run's verdict over time, provenance counts by origin.
Every label goes through :func:`servewitness.report.escape.text`; every coordinate is a number
this module computed."""

from __future__ import annotations

import math
from collections.abc import Sequence

from servewitness.report.escape import num, text, when
from servewitness.report.model import Sample

VERDICT_COLOURS = {"PASS": "#2e7d32", "FAIL": "#c62828", "PENDING": "#f9a825", "STALE": "#757575"}
LINE_COLOURS = ("#1565c0", "#6a1b9a", "#00838f", "#ef6c00", "#ad1457", "#558b2f", "#4e342e")
MAX_LINES = 8  # hooks drawn per process (beyond: named in the legend as left out)
W, H, PAD_L, PAD_R, PAD_T, PAD_B = 640, 150, 56, 12, 10, 34


def _span(t0: float, t1: float) -> tuple[float, float]:
    if not (math.isfinite(t0) and math.isfinite(t1)):
        return 0.0, 1.0
    return (t0, t1) if t1 > t0 else (t0 - 0.5, t0 + 0.5)


def _points(values: Sequence[tuple[float, int]], t0: float, t1: float, top: int) -> str:
    iw, ih = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    out = []
    for t, v in values:
        x = PAD_L + (t - t0) / (t1 - t0) * iw
        y = PAD_T + ih - (min(max(v, 0), top) / top) * ih
        out.append(f"{x:.1f},{y:.1f}")
    return " ".join(out)


def timeline(samples: Sequence[Sample], t0: float, t1: float, label: str) -> str:
    """One process's counters (steps run, steps productive, each hook's fires) at each
    sampled report, on a shared time axis T0..T1 (the target's first and last report).
    LABEL names the process (escaped here)."""
    t0, t1 = _span(t0, t1)
    finite = [s for s in samples if math.isfinite(s.at_unix)]
    hooks: list[str] = []
    for s in finite:
        hooks += [n for n, _ in s.hooks if n not in hooks]
    shown, left = hooks[: MAX_LINES - 2], hooks[MAX_LINES - 2 :]
    series: list[tuple[str, list[tuple[float, int]], bool]] = [
        ("steps", [(s.at_unix, s.steps) for s in finite], False),
        ("productive steps", [(s.at_unix, s.productive) for s in finite], False),
    ]
    for h in shown:
        series.append(
            (f"hook {h} fires", [(s.at_unix, dict(s.hooks).get(h, 0)) for s in finite], True)
        )
    top = max([1] + [v for _, vs, _ in series for _, v in vs])
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {W} '
        f'{H + 18 * ((len(series) + 2) // 3)}" width="{W}"><title>{text(label)}: steps and '
        "hook fires over time</title>",
        f'<rect x="{PAD_L}" y="{PAD_T}" width="{W - PAD_L - PAD_R}" height="{H - PAD_T - PAD_B}" '
        'fill="#fafafa" stroke="#bbb"/>',
        f'<text x="{PAD_L - 4}" y="{PAD_T + 10}" text-anchor="end" class="ax">{num(top)}</text>',
        f'<text x="{PAD_L - 4}" y="{H - PAD_B}" text-anchor="end" class="ax">0</text>',
        f'<text x="{PAD_L}" y="{H - PAD_B + 14}" class="ax">{text(when(t0))}</text>',
        f'<text x="{W - PAD_R}" y="{H - PAD_B + 14}" text-anchor="end" class="ax">'
        f"{text(when(t1))}</text>",
    ]
    for i, (name, values, dashed) in enumerate(series):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        if len(values) == 1:
            (x, y) = _points(values, t0, t1, top).split(",")
            parts.append(f'<circle cx="{x}" cy="{y}" r="3" fill="{colour}"/>')
        elif values:
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} '
                f'points="{_points(values, t0, t1, top)}"/>'
            )
        lx, ly = PAD_L + (i % 3) * 200, H - 4 + 18 * (i // 3)
        parts.append(
            f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="2"{dash}/><text x="{lx + 22}" y="{ly}" class="lg">'
            f"{text(name, 40)} ({num(values[-1][1]) if values else '-'})</text>"
        )
    if left:
        parts.append(
            f'<text x="{PAD_L}" y="{H + 18 * ((len(series) + 2) // 3) - 2}" class="lg">'
            f"{len(left)} more hook(s) not drawn: {text(', '.join(left), 120)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def history(changes: Sequence[tuple[float, str]], end: float) -> str:
    """The run's verdict over time: one band per verdict change, until END (now)."""
    pts = [(t, v) for t, v in changes if math.isfinite(t)]
    if not pts:
        return ""
    t0, t1 = _span(pts[0][0], max(end, pts[-1][0]))
    iw = W - PAD_L - PAD_R
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {W} 46" '
        f'width="{W}"><title>verdict over time</title>'
    ]
    for i, (t, v) in enumerate(pts):
        nxt = pts[i + 1][0] if i + 1 < len(pts) else t1
        x0 = PAD_L + (t - t0) / (t1 - t0) * iw
        x1 = PAD_L + (nxt - t0) / (t1 - t0) * iw
        parts.append(
            f'<rect x="{x0:.1f}" y="4" width="{max(x1 - x0, 1.0):.1f}" height="20" '
            f'fill="{VERDICT_COLOURS.get(v, "#9e9e9e")}"><title>{text(v, 20)} from '
            f"{text(when(t))}</title></rect>"
        )
    parts.append(f'<text x="{PAD_L}" y="40" class="ax">{text(when(t0))}</text>')
    parts.append(
        f'<text x="{W - PAD_R}" y="40" text-anchor="end" class="ax">{text(when(t1))}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)


def bars(counts: Sequence[tuple[str, int]]) -> str:
    """Files by origin, one horizontal bar each (LABELs escaped)."""
    rows = [(o, n) for o, n in counts if isinstance(n, int) and n > 0]
    if not rows:
        return ""
    top = max(n for _, n in rows)
    iw = W - 140 - 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {W} '
        f'{22 * len(rows) + 6}" width="{W}"><title>loaded files by origin</title>'
    ]
    for i, (origin, n) in enumerate(rows):
        y = 4 + 22 * i
        w = max(n / top * iw, 1.0)
        parts.append(
            f'<text x="132" y="{y + 14}" text-anchor="end" class="lg">{text(origin, 24)}</text>'
            f'<rect x="140" y="{y}" width="{w:.1f}" height="16" '
            f'fill="{LINE_COLOURS[i % len(LINE_COLOURS)]}"/>'
            f'<text x="{140 + w + 6:.1f}" y="{y + 13}" class="lg">{num(n)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
