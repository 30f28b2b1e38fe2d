"""Reading a snapshot the way every rule needs to: which processes a rule judges, and how a
process is named in a message. A process a rule needs and cannot judge yields a PENDING
finding here, so no rule can mistake missing evidence for a pass."""

from __future__ import annotations

from typing import Any

from servewitness.model import FileEntry, Finding, ProcessReport, Severity
from servewitness.policy import findings as F
from servewitness.policy import interface as I

SHOWN = 10  # paths or errors listed in a finding's context before "... and N more"
_ROLE_ORDER = {role: i for i, role in enumerate(I.ROLES)}


def ordered(processes: tuple[ProcessReport, ...]) -> list[ProcessReport]:
    """Processes in a stable order: by role (api_server first), then rank, then pid."""
    return sorted(
        processes,
        key=lambda p: (
            _ROLE_ORDER.get(p.role, len(_ROLE_ORDER)),
            p.role,
            -1 if p.rank is None else p.rank,
            p.key.pid,
        ),
    )


def name(p: ProcessReport) -> str:
    """``worker rank 0 (pid 123)``, ``engine_core (pid 42)``."""
    rank = "" if p.rank is None else f" rank {p.rank}"
    return f"{p.role}{rank} (pid {p.key.pid})"


def base(p: ProcessReport) -> dict[str, Any]:
    return {"pid": p.key.pid, "role": p.role, "rank": p.rank}


def productive(p: ProcessReport) -> int:
    return p.steps.productive if p.steps is not None else 0


def total(p: ProcessReport) -> int:
    return p.steps.total if p.steps is not None else 0


def finding(
    id_: str, severity: Severity, message: str, snap: I.TargetSnapshot, **context: Any
) -> Finding:
    return Finding(id_, severity, message, snap.target, context)


def _unprobed(
    procs: list[ProcessReport], snap: I.TargetSnapshot, ctx: I.EvalContext, needed_by: str
) -> list[Finding]:
    """Processes a rule cannot judge for lack of a probe. A role in require_probe already gets
    ``evidence.probe_absent`` (an ERROR); any other role gets a PENDING finding here."""
    return [
        finding(
            F.EVIDENCE_UNPROBED,
            Severity.PENDING,
            f"{name(p)} has no probe and {p.role} is not in require_probe, so {needed_by} "
            "cannot be judged there",
            snap,
            **base(p),
            rule=needed_by,
        )
        for p in procs
        if not p.probe_present and p.role not in ctx.require_probe
    ]


def _missing(snap: I.TargetSnapshot, role: str | None, needed_by: str, what: str) -> Finding:
    return finding(
        F.EVIDENCE_ROLE_MISSING,
        Severity.PENDING,
        f"no {what} is in the report of target {snap.target}, and {needed_by} needs one",
        snap,
        role=role,
        rule=needed_by,
    )


def of_role(
    snap: I.TargetSnapshot, ctx: I.EvalContext, role: str, needed_by: str
) -> tuple[list[ProcessReport], list[Finding]]:
    """The processes of ROLE, and PENDING findings for what cannot be judged (callers judge
    only the probed ones: see ``probed``)."""
    procs = [p for p in ordered(snap.processes) if role in p.all_roles]
    if not procs:
        return [], [_missing(snap, role, needed_by, f"{role} process")]
    return procs, _unprobed(procs, snap, ctx, needed_by)


def steppers(
    snap: I.TargetSnapshot, ctx: I.EvalContext, needed_by: str
) -> tuple[list[ProcessReport], list[Finding]]:
    """The processes that run engine steps: every worker, or (no worker process, as at tensor
    parallel size 1 where the runner lives in the engine core) every process with a runner."""
    if any(p.role == "worker" for p in snap.processes):
        return of_role(snap, ctx, "worker", needed_by)
    with_runner = [p for p in ordered(snap.processes) if p.probe_present and p.runner is not None]
    if with_runner:
        return with_runner, []
    candidates = [p for p in ordered(snap.processes) if p.role in I.STEP_ROLES]
    missing = _missing(
        snap,
        "worker",
        needed_by,
        "process that runs steps (no worker process, and no process with a live runner)",
    )
    return [], [missing, *_unprobed(candidates, snap, ctx, needed_by)]


def any_main(
    snap: I.TargetSnapshot, ctx: I.EvalContext, needed_by: str
) -> tuple[list[ProcessReport], list[Finding]]:
    """Every api_server, engine_core or worker process (helpers and unknown processes are
    ignored unless a rule names their role)."""
    procs = [p for p in ordered(snap.processes) if p.role not in I.IGNORED_ROLES]
    if not procs:
        return [], [_missing(snap, None, needed_by, "api_server, engine_core or worker process")]
    return procs, _unprobed(procs, snap, ctx, needed_by)


def probed(procs: list[ProcessReport]) -> list[ProcessReport]:
    return [p for p in procs if p.probe_present]


def with_files(
    procs: list[ProcessReport], snap: I.TargetSnapshot, needed_by: str
) -> tuple[list[ProcessReport], list[Finding]]:
    """The probed PROCS whose file list is known, and PENDING findings for the rest."""
    procs = probed(procs)
    known = [p for p in procs if p.files is not None]
    pending = [
        finding(
            F.EVIDENCE_MANIFEST_UNRESOLVED,
            Severity.PENDING,
            (
                f"the report for {name(p)} carries only its manifest digest, not its files, so "
                if p.manifest_digest is not None
                else f"the report for {name(p)} names no manifest (no digest, no files), so "
            )
            + f"{needed_by} cannot be judged there",
            snap,
            **base(p),
            manifest_digest=p.manifest_digest,
            rule=needed_by,
        )
        for p in procs
        if p.files is None
    ]
    return known, pending


def serving(snap: I.TargetSnapshot, ctx: I.EvalContext) -> bool:
    """Whether some process of the target has run min_steps productive steps (by then every
    module the serving path imports lazily has been imported)."""
    return bool(snap.processes) and snap.most_productive >= ctx.min_steps


def insufficient(p: ProcessReport, snap: I.TargetSnapshot, ctx: I.EvalContext) -> Finding:
    """One per process (the engine merges identical findings from several rules)."""
    s = productive(p)
    return finding(
        F.STEPS_INSUFFICIENT,
        Severity.PENDING,
        f"{name(p)} has run {s} productive steps, fewer than min_steps {ctx.min_steps}, so "
        "its liveness cannot be judged yet",
        snap,
        **base(p),
        steps=s,
        total_steps=total(p),
        min_steps=ctx.min_steps,
    )


def paths(entries: list[FileEntry]) -> list[str]:
    shown = sorted({e.path for e in entries})
    more = [f"... and {len(shown) - SHOWN} more"] if len(shown) > SHOWN else []
    return shown[:SHOWN] + more


def norm_sha(sha: str | None) -> str | None:
    """Lowercase hex without a ``sha256:`` prefix (None stays None)."""
    return None if sha is None else sha.strip().lower().removeprefix("sha256:")


def short_sha(sha: str | None) -> str:
    return "none" if sha is None else sha[:12]
