"""One class per rule kind. Each reads a snapshot and returns findings; none decides a verdict.

Rules judge only what they can see: a process without the probe, a role that has not reported,
or too few engine steps give PENDING findings (``_evidence``), never a pass and never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servewitness.model import (
    DRIFT_CHANGED_IN_CACHE,
    FileEntry,
    Finding,
    LogLine,
    ProcessReport,
    Severity,
)
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy.rules_evidence import (
    EvidenceIntact,
    NativeIntact,
    ProbeRequired,
    ViewsAgree,
)
from servewitness.policy.rules_hooks import HookFires

__all__ = [
    "EvidenceIntact",
    "ExpectRunner",
    "FileSpec",
    "ForbidFile",
    "HookFires",
    "NativeIntact",
    "ProbeRequired",
    "RequireFile",
    "RunnerWitnessed",
    "ViewsAgree",
]

# Kinds whose recorded hash is of the file (or zip member, or -c code) a path names as it is:
# what a [[files]] sha256 is compared with.
_SOURCE_KINDS = frozenset({"source", "extension", "pth", "archive", "member", "inline"})


WITNESS_SAMPLES_FOR_ERROR = 200  # samples without a hit after which the witness FAILs
# (the tiny CPU model's steps are caught by about 1 sample in 15: 200 misses in a row would
# happen by chance about once in 10**6)


@dataclass(frozen=True)
class RunnerWitnessed:
    """``[runner] witness = true``: the agent's stack samples (py-spy, from outside the
    process) caught a thread in the live runner's step file while steps advanced. PENDING
    until one did; ERROR after WITNESS_SAMPLES_FOR_ERROR samples that all missed it."""

    def describe(self) -> str:
        return "[runner] witness"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.steppers(snapshot, ctx, self.describe())
        for p in E.probed(procs):
            w = p.stack_witness
            context: dict[str, Any] = {
                **E.base(p),
                "runner_file": p.runner.file if p.runner else None,
                "samples": w.samples if w else 0,
                "runner_file_hits": w.runner_file_hits if w else 0,
                "top_files": list(w.top_files) if w else [],
                "error": w.error if w else "no stack samples in the report",
            }
            if w is not None and w.runner_file_hits > 0:
                out.append(
                    E.finding(
                        F.RUNNER_WITNESSED,
                        Severity.INFO,
                        f"{w.runner_file_hits} of {w.samples} stack samples of {E.name(p)} "
                        f"caught it in {w.runner_file}",
                        snapshot,
                        **context,
                    )
                )
                continue
            many = w is not None and w.samples >= WITNESS_SAMPLES_FOR_ERROR
            why = f" ({context['error']})" if context["error"] else ""
            out.append(
                E.finding(
                    F.RUNNER_UNWITNESSED,
                    Severity.ERROR if many else Severity.PENDING,
                    f"no stack sample of {E.name(p)} has caught a thread in the runner's step "
                    f"file yet ({context['samples']} samples while steps ran){why}",
                    snapshot,
                    **context,
                )
            )
        return out


_CAUSE_LEVELS = frozenset({"WARNING", "ERROR", "CRITICAL"})


def _cause_line(lines: tuple[LogLine, ...]) -> LogLine | None:
    """The line among LINES (vLLM's log lines about the model runner) that gives a reason for
    the runner chosen: a warning that says it used another runner instead or fell back, else
    the first warning; None when vLLM logged no warning about the runner."""
    warnings = [x for x in lines if x.level in _CAUSE_LEVELS]
    switched = (x for x in warnings if "instead" in x.message or "fall" in x.message.lower())
    return next(switched, warnings[0] if warnings else None)


def runner_cause(
    p: ProcessReport, snapshot: I.TargetSnapshot
) -> tuple[LogLine, ProcessReport] | None:
    """vLLM's logged reason for the runner P runs, and the process that logged it: P's own
    lines first, then the other processes of the target (the API server and the engine core
    read the same config and log the same choice)."""
    others = [q for q in E.ordered(snapshot.processes) if q is not p]
    for q in (p, *others):
        line = _cause_line(q.runner_log)
        if line is not None:
            return line, q
    return None


@dataclass(frozen=True)
class ExpectRunner:
    """``[runner] expect_class``: the live runner object in every process that runs steps."""

    expect_class: str

    def describe(self) -> str:
        return f"[runner] expect_class {self.expect_class}"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.steppers(snapshot, ctx, self.describe())
        for p in E.probed(procs):
            enough = E.productive(p) >= ctx.min_steps
            context: dict[str, Any] = {
                **E.base(p),
                "expected": self.expect_class,
                "productive_steps": E.productive(p),
                "total_steps": E.total(p),
                "min_steps": ctx.min_steps,
            }
            if p.runner is None:
                out.append(
                    E.finding(
                        F.RUNNER_UNKNOWN,
                        Severity.PENDING,
                        f"{E.name(p)} has no live runner recorded yet, so it cannot be checked "
                        f"against the expected {self.expect_class}",
                        snapshot,
                        **context,
                    )
                )
            elif p.runner.cls != self.expect_class:
                found = runner_cause(p, snapshot)
                if found is None:
                    why = "; no cause logged by vLLM"
                    cause: dict[str, Any] = {"cause": None}
                else:
                    line, q = found
                    where = "" if q is p else f" in {E.name(q)}"
                    why = f"; cause: {line.message} (vLLM {line.level}{where})"
                    cause = {
                        "cause": line.message,
                        "cause_level": line.level,
                        "cause_logger": line.logger,
                        "cause_pid": q.key.pid,
                        "cause_role": q.role,
                    }
                spec = p.steps.spec if p.steps is not None else None
                out.append(
                    E.finding(
                        F.RUNNER_UNEXPECTED,
                        Severity.ERROR if enough else Severity.PENDING,
                        f"the live runner in {E.name(p)} is {p.runner.cls}, not the expected "
                        f"{self.expect_class}{why}",
                        snapshot,
                        **context,
                        actual=p.runner.cls,
                        mro=list(p.runner.mro),
                        file=p.runner.file,
                        **cause,
                        speculation=spec.method if spec is not None and spec.on else None,
                    )
                )
            if not enough:
                out.append(E.insufficient(p, snapshot, ctx))
        return out


@dataclass(frozen=True)
class FileSpec:
    """Which loaded files an entry means: a path suffix (at a ``/`` boundary) or a module."""

    path: str | None = None
    module: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.module is None):
            raise ValueError("a FileSpec needs exactly one of path and module")

    def describe(self) -> str:
        return f"path {self.path}" if self.path is not None else f"module {self.module}"

    def matches(self, entry: FileEntry) -> bool:
        if self.path is not None:
            return entry.path == self.path or entry.path.endswith("/" + self.path)
        return entry.module == self.module

    def comparable_kinds(self) -> frozenset[str]:
        """Kinds whose hash is the hash of what the policy names (bytecode only if it names
        a .pyc: the bytecode of a source file has another hash)."""
        if self.path is not None and self.path.endswith(".pyc"):
            return _SOURCE_KINDS | {"bytecode"}
        return _SOURCE_KINDS


@dataclass(frozen=True)
class RequireFile:
    """``[[files]]``: a matching file is loaded (in every process of ``role``, or without a role
    in at least one process of the target), with the expected sha256 if one is given."""

    spec: FileSpec
    role: str | None = None
    sha256: str | None = None

    def describe(self) -> str:
        return f"[[files]] {self.spec.describe()}"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        if self.role is None:
            procs, out = E.any_main(snapshot, ctx, self.describe())
        else:
            procs, out = E.of_role(snapshot, ctx, self.role, self.describe())
        known, pending = E.with_files(procs, snapshot, self.describe())
        out.extend(pending)
        if self.role is not None:
            groups = [[p] for p in known]
        elif known and len(known) == len(procs):
            groups = [known]  # a file missing from the union is missing only if all are known
        else:
            groups = []
        for group in groups:
            out.extend(self._judge(group, snapshot, ctx))
        return out

    def _judge(
        self, group: list[ProcessReport], snap: I.TargetSnapshot, ctx: I.EvalContext
    ) -> list[Finding]:
        matches = [(p, e) for p in group for e in p.files or () if self.spec.matches(e)]
        if not matches:
            if len(group) == 1:
                where, context = E.name(group[0]), E.base(group[0])
            else:
                where = f"any api_server, engine_core or worker process of target {snap.target}"
                context = {"pids": [p.key.pid for p in group], "role": None, "rank": None}
            return [
                E.finding(
                    F.FILE_NOT_LOADED,
                    Severity.ERROR if E.serving(snap, ctx) else Severity.PENDING,
                    f"no loaded file matches {self.spec.describe()} in {where}",
                    snap,
                    **context,
                    path=self.spec.path,
                    module=self.spec.module,
                    serving=E.serving(snap, ctx),
                    min_steps=ctx.min_steps,
                )
            ]
        if self.sha256 is None:
            return []
        kinds = self.spec.comparable_kinds()
        out: list[Finding] = []
        for p in group:
            mine = [e for proc, e in matches if proc is p]
            comparable = [e for e in mine if e.kind in kinds]
            unhashed = [e for e in comparable if E.norm_sha(e.sha256) is None]
            unjudged = _waived(p, comparable)
            if mine and (not comparable or unhashed or unjudged):
                out.append(self._unverifiable(p, mine, comparable, snap, unjudged))
            for e in comparable:
                actual = E.norm_sha(e.sha256)
                if actual is not None and actual != self.sha256:
                    out.append(
                        E.finding(
                            F.FILE_HASH_MISMATCH,
                            Severity.ERROR,
                            f"{e.path} loaded in {E.name(p)} has sha256 {E.short_sha(actual)}..., "
                            f"not the expected {E.short_sha(self.sha256)}...",
                            snap,
                            **E.base(p),
                            path=e.path,
                            kind=e.kind,
                            module=e.module,
                            expected=self.sha256,
                            actual=actual,
                        )
                    )
        return out

    def _unverifiable(
        self,
        p: ProcessReport,
        mine: list[FileEntry],
        comparable: list[FileEntry],
        snap: I.TargetSnapshot,
        unjudged: list[FileEntry] | None = None,
    ) -> Finding:
        if unjudged:
            why = (
                "hashed after the fact and changed after the process started, under its compile "
                "caches or temporary directories (its own environment names them), where the "
                "agent does not judge such a change (provenance.file.changed_in_cache)"
            )
        elif comparable:
            why = "some of them were recorded without a hash"
        else:
            why = f"only as {', '.join(sorted({e.kind for e in mine}))}, not as source"
        return E.finding(
            F.FILE_UNVERIFIABLE,
            Severity.PENDING,
            f"files matching {self.spec.describe()} are loaded in {E.name(p)} but {why}, so "
            "the expected sha256 cannot be checked",
            snap,
            **E.base(p),
            paths=E.paths(mine),
            kinds=sorted({e.kind for e in mine}),
            comparable_kinds=sorted(self.spec.comparable_kinds()),
            expected=self.sha256,
        )


def _waived(p: ProcessReport, entries: list[FileEntry]) -> list[FileEntry]:
    """ENTRIES of P whose change after the process started the agent waived
    (``provenance.file.changed_in_cache``: under its compile caches or temporary directories,
    claimed by no RECORD row): their hash may not be the bytes that ran (a file swapped back
    after its import), so a pin cannot be checked against it. The process names the
    directories that waive the check (``TMPDIR=/``)."""
    waived = {d.path for d in p.drift if d.id == DRIFT_CHANGED_IN_CACHE}
    return [e for e in entries if e.path in waived] if waived else []


@dataclass(frozen=True)
class ForbidFile:
    """``[[forbid]]``: no matching file is loaded in any process of ``role`` (or of the target).
    A process that cannot be seen could hold it, so it gives PENDING, not a pass."""

    spec: FileSpec
    role: str | None = None

    def describe(self) -> str:
        return f"[[forbid]] {self.spec.describe()}"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        if self.role is None:
            procs, out = E.any_main(snapshot, ctx, self.describe())
        else:
            procs, out = E.of_role(snapshot, ctx, self.role, self.describe())
        known, pending = E.with_files(procs, snapshot, self.describe())
        out.extend(pending)
        for p in known:
            hits = [e for e in p.files or () if self.spec.matches(e)]
            if hits:
                out.append(
                    E.finding(
                        F.FILE_FORBIDDEN,
                        Severity.ERROR,
                        f"{E.name(p)} loaded {hits[0].path}, which matches the forbidden "
                        f"{self.spec.describe()}",
                        snapshot,
                        **E.base(p),
                        path=self.spec.path,
                        module=self.spec.module,
                        paths=E.paths(hits),
                        count=len(hits),
                    )
                )
        return out
