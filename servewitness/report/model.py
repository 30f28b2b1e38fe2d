"""What a report shows, as plain values: one :class:`Report` per run, whichever source it came
from (a database, a live verifier, or both: :func:`merge`), and the caps that keep a page of a
huge run small (each cap that cut something is named on the page: :attr:`Report.notes`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Caps: what one page holds at most. A run past one is cut, and the page says where.
MAX_TARGETS = 50
MAX_PROCESSES = 32  # per target
MAX_SAMPLES = 240  # timeline points per target (reports read, evenly spread over the run)
MAX_FINDINGS = 300
MAX_HISTORY = 200  # verdict changes (the latest kept)
MAX_WINDOWS = 20  # measurement windows (the latest kept)
MAX_FILES = 20  # files not pristine, per process
MAX_TEXT = 300  # characters of one stored text (a path, a message) before it is elided

WITHOUT_DB = (
    "a live verifier answers only the current verdict and counts: the timeline, the provenance "
    "by origin and the measurement windows need its database (--db)"
)


@dataclass(frozen=True)
class FindingRow:
    id: str
    severity: str  # error | pending | warning | info ("" when only the id is known)
    message: str
    target: str = ""  # "" for a run-level finding


@dataclass(frozen=True)
class HookRow:
    """One policy hook in one process, as the latest verdict judged it."""

    name: str
    fired: int  # in all
    on: str  # the steps it is judged on: productive | decode | prefill
    judged_fired: int
    judged_steps: int
    min_per_step: float


@dataclass(frozen=True)
class Sample:
    """One report's view of one process: its step counters and every hook's fires."""

    at_unix: float
    steps: int
    productive: int
    hooks: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class FileRow:
    origin: str
    path: str
    reason: str


@dataclass(frozen=True)
class ProcessView:
    pid: int
    role: str
    rank: int | None
    container_id: str | None = None
    runner: str | None = None
    first_unix: float | None = None
    last_unix: float | None = None
    samples: tuple[Sample, ...] = ()  # oldest first
    hooks: tuple[HookRow, ...] = ()
    origins: tuple[tuple[str, int], ...] = ()  # provenance counts of its latest report
    files: tuple[FileRow, ...] = ()  # not pristine (capped at MAX_FILES)
    files_total: int = 0

    @property
    def key(self) -> tuple[int, str]:
        return (self.pid, self.role)


@dataclass(frozen=True)
class TargetView:
    target: str
    verdict: str = ""  # "" when no verdict judged it
    state: str = ""  # live | expired | forgotten ... ("" unknown)
    last_report_unix: float | None = None
    age_s: float | None = None
    agent_id: str = ""
    reports: int = 0  # stored reports of it
    processes: tuple[ProcessView, ...] = ()
    processes_total: int = 0


@dataclass(frozen=True)
class WindowHook:
    name: str
    pid: int
    role: str
    rank: int | None
    on: str
    fired: int
    steps: int


@dataclass(frozen=True)
class WindowView:
    window_id: str
    opened_unix: float
    sealed_unix: float | None = None  # None: open (never sealed)
    held: bool | None = None
    verdict_at_open: str = ""
    verdict_at_seal: str = ""
    results_name: str = ""
    results_sha256: str = ""
    findings: tuple[FindingRow, ...] = ()
    hooks: tuple[WindowHook, ...] = ()


@dataclass(frozen=True)
class Report:
    run: str
    verdict: str  # PASS | FAIL | PENDING | STALE, or "" when nothing judged it yet
    policy_digest: str = ""
    source: str = ""  # the policy file it was registered from
    created_unix: float | None = None
    verdict_unix: float | None = None
    history: tuple[tuple[float, str], ...] = ()  # (when, verdict), oldest first
    findings: tuple[FindingRow, ...] = ()
    targets: tuple[TargetView, ...] = ()
    windows: tuple[WindowView, ...] = ()
    origins: tuple[tuple[str, int], ...] = ()  # over the latest report of every process
    unsafe_flags: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()  # where it was read: "database PATH", "verifier ADDR"
    notes: tuple[str, ...] = ()  # caps that cut something; what a source cannot show
    mismatches: tuple[str, ...] = ()  # stored rows that disagree with their ledger entry
    generated_unix: float = 0.0


def _by_target(targets: tuple[TargetView, ...]) -> dict[str, TargetView]:
    return {t.target: t for t in targets}


def _merge_target(stored: TargetView | None, live: TargetView) -> TargetView:
    """LIVE's verdict and liveness, STORED's timeline and provenance, with LIVE's hook counts
    on the processes both know."""
    if stored is None:
        return live
    hooks = {p.key: p.hooks for p in live.processes}
    procs = tuple(dataclasses.replace(p, hooks=hooks.get(p.key, p.hooks)) for p in stored.processes)
    known = {p.key for p in procs}
    extra = tuple(p for p in live.processes if p.key not in known)
    return dataclasses.replace(
        live,
        reports=stored.reports,
        processes=procs + extra,
        processes_total=max(stored.processes_total, len(procs + extra)),
    )


def merge(stored: Report, live: Report) -> Report:
    """One report from a database (STORED: history, timelines, provenance, windows) and the
    verifier writing it (LIVE: the current verdict, findings with their messages, liveness)."""
    old = _by_target(stored.targets)
    targets = tuple(_merge_target(old.pop(t.target, None), t) for t in live.targets)
    return dataclasses.replace(
        stored,
        verdict=live.verdict,
        verdict_unix=live.verdict_unix,
        policy_digest=live.policy_digest or stored.policy_digest,
        findings=live.findings,
        targets=targets + tuple(old.values()),
        unsafe_flags=live.unsafe_flags or stored.unsafe_flags,
        sources=stored.sources + live.sources,
        notes=stored.notes
        + tuple(n for n in live.notes if n not in stored.notes and n != WITHOUT_DB),
    )
