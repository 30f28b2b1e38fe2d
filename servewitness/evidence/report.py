"""One process's report: its probe's evidence (``servewitness.model`` types, as the reader
returns them) with the agent's own ``/proc`` evidence added and the files judged. The agent
and the local commands (``inspect``, ``diff``, ``policy init``) build reports here alike."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from servewitness.evidence.codecheck import check_chains
from servewitness.evidence.container import container_of
from servewitness.evidence.distindex import DistIndex, norm_path
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.judge import (
    Judgement,
    dist_index,
    judge,
    started_environment,
)
from servewitness.evidence.native import NativeMemory, native_mappings
from servewitness.evidence.places import GeneratedFiles, generated_dirs, stdlib_test
from servewitness.evidence.process import ProcessEvidence
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.stdlib import stdlib_dirs
from servewitness.evidence.verdicts import VerdictStore
from servewitness.model import (
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    EVIDENCE_STDLIB_UNCONFIRMED,
    HASHED_AFTER_SHOWN,
    EvidenceProblem,
    FileEntry,
    ProcessKey,
    ProcessReport,
    Provenance,
)

# What ``ProcessReport.hashed_after`` lists: the files whose only hash was taken after the
# fact. A ``deferred`` source is not among them: what ran is its bytecode, hashed as read.
HASHED_AFTER = frozenset({"snapshot", "late"})


def to_report(procfs: ProcFS, ev: ProcessEvidence, hasher: Hasher | None = None) -> ProcessReport:
    """One process's report with the agent's own /proc evidence added (everything judged now)."""
    return report_with_judgement(procfs, ev, hasher)[0]


def report_with_judgement(
    procfs: ProcFS,
    ev: ProcessEvidence,
    hasher: Hasher | None = None,
    *,
    previous: Judgement | None = None,
    index: DistIndex | None = None,
    reuse: Judgement | None = None,
    memory: NativeMemory | None = None,
    verdicts: VerdictStore | None = None,
    disk_checked: bool = False,
) -> tuple[ProcessReport, Judgement | None]:
    """One process's report with the agent's own /proc evidence added. HASHER: reuse one so
    unchanged files are answered from its cache. PREVIOUS: the last judgement of its files, to
    reuse instead of re-checking every file (None: check now). INDEX: the process's
    distribution index, to reuse (see ``judge.dist_index``). REUSE: an earlier judgement whose
    manifest-only part (origins, bytecode) is kept while the manifest is unchanged. MEMORY:
    the native mappings' bytes first seen (the agent's, across reports), so a library
    rewritten in place between two reports is ``changed``. VERDICTS: compile outcomes kept
    across agent restarts (``verdicts.py``). DISK_CHECKED: REUSE's disk was found unchanged
    just now (``judge.judge``). The code that runs each step
    method and hook target is verified every time (``codecheck``)."""
    ident = ev.identity
    ref = container_of(procfs, ident.pid)
    container = ref.id if ref else None
    hasher = hasher or Hasher()
    key = ProcessKey(ident.boot_id, ident.pid, ident.start_ticks)
    probe = ev.probe
    index = index or dist_index(procfs, ident.pid)  # lazy: sites are read as paths ask
    environ = started_environment(procfs, ident.pid)
    stdlib, unconfirmed = stdlib_dirs(procfs, ident.pid, probe, environ) if probe else ((), None)
    # a library rewritten in place is exempt only where it is generated, never a distribution's
    generated = GeneratedFiles(generated_dirs(environ), index, stdlib)
    mappings = native_mappings(
        procfs, ident.pid, hasher, start_time=ident.start_time, generated=generated
    )
    if memory is not None:
        mappings = memory.check(key, mappings)
    base = ProcessReport(
        key=key,
        ns_pid=ident.ns_pid,
        ppid=ident.ppid,
        start_time=ident.start_time,
        role=ev.role,
        rank=ev.rank,
        container_id=container,
        cmdline=ident.cmdline,
        exe=ident.exe,
        probe_present=ev.probe is not None,
        evidence_problems=tuple(EvidenceProblem(EVIDENCE_PROBE_UNBOUND, x) for x in ev.unbound)
        + ((EvidenceProblem(EVIDENCE_STDLIB_UNCONFIRMED, unconfirmed),) if unconfirmed else ()),
        native_mappings=mappings,
        roles=tuple(ev.roles),
    )
    if probe is None:
        return base, None
    runner = probe.runner
    now = None
    if runner is not None and runner.file:
        now = hasher.hash_file(procfs.in_root_str(ident.pid, runner.file)).sha256
    judged = previous or judge(
        procfs,
        ident.pid,
        probe,
        probe.files,
        hasher,
        start_time=ident.start_time,
        index=index,
        reuse=reuse,
        native=mappings,
        verdicts=verdicts,
        stdlib=stdlib,
        environ=environ,
        disk_checked=disk_checked,
    )
    # What runs the step methods and hook targets: verified on every report (a chain can
    # change without any file changing; compiled files are cached).
    code, code_drift = check_chains(
        probe.code,
        probe.files,
        lambda path: procfs.in_root(ident.pid, path),
        index=index,
        owners=dict(judged.owners),
        facts=verdicts,
    )
    drift = sorted((*judged.drift, *code_drift), key=lambda d: (d.id, d.path))
    after = hashed_after(probe.files, stdlib)
    report = dataclasses.replace(
        base,
        probe_errors=probe_errors(probe.errors, probe.files, judged.provenance, stdlib),
        runner=runner,
        steps=probe.steps,
        hooks=probe.hooks,
        manifest_digest=probe.manifest_digest,
        files=probe.files,
        runner_file_sha256_now=now,
        disagreements=judged.disagreements,
        provenance=judged.provenance,
        drift=tuple(drift),
        runner_log=probe.runner_log,
        evidence_problems=base.evidence_problems
        + tuple(EvidenceProblem(EVIDENCE_JOURNAL_EDITED, why) for why in probe.journal_problems),
        code=code,
        hashed_after=tuple(after[:HASHED_AFTER_SHOWN]),
        hashed_after_count=len(after),
        probe_started_ticks=started_ticks(probe.started_boottime, ident.start_ticks),
        children=probe.children,
    )
    return report, judged


# What an audit hook added by a distribution's published code is reported as: said in every
# verdict, not judged (``policy/probe_errors.py``)
AUDIT_HOOK_PRISTINE = "audit_hook"


def probe_errors(
    errors: Sequence[Mapping[str, Any]],
    files: Sequence[FileEntry],
    provenance: Provenance | None,
    stdlib: Sequence[str],
) -> tuple[str, ...]:
    """The probe's error records as ``[where] message``. An ``imports`` error whose cause
    the probe names by file (``by``: the code that added an audit hook after it started, as
    filelock does at import to guard its locks across ``fork``) is ``audit_hook`` instead
    when that file is one the process loaded and the agent judged pristine against its
    distribution's RECORD: the hook is that distribution's published code. Any other file
    (unknown, patched, the standard library, none) leaves it ``imports``: judged."""
    pristine: Callable[[str], bool] = lambda _path: False  # noqa: E731 - no provenance
    if provenance is not None:
        not_pristine = {norm_path(f.path) for f in provenance.files}
        hashed = {norm_path(f.path) for f in files if f.sha256 and f.kind != "bytecode"}
        in_stdlib = stdlib_test(stdlib)

        def pristine(path: str) -> bool:
            p = norm_path(path)
            return p in hashed and p not in not_pristine and not in_stdlib(p)

    out = []
    for e in errors:
        where, msg, by = e.get("where"), e.get("msg"), e.get("by")
        if where == AUDIT_HOOK_PRISTINE:  # the agent's to say, never the process's
            where = "imports"
        if where == "imports" and isinstance(by, str) and pristine(by):
            where = AUDIT_HOOK_PRISTINE
            msg = f"{msg} ({by} is pristine: its distribution's published code)"
        out.append(f"[{where}] {msg}")
    return tuple(out)


def started_ticks(boottime: float | None, start_ticks: int) -> int | None:
    """The probe's start (BOOTTIME, seconds since boot, the process's word) in the clock
    ticks /proc counts a process's start in, rounded down; None when it is absent or not
    possible: before the process started (a probe cannot start before its process), or
    after now."""
    if boottime is None:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    ticks = int(boottime * hz)
    if ticks < start_ticks or boottime > time.clock_gettime(time.CLOCK_BOOTTIME):
        return None
    return ticks


def hashed_after(files: tuple[FileEntry, ...], stdlib: tuple[str, ...] = ()) -> list[str]:
    """The paths of FILES whose only hash was taken after the fact (``HASHED_AFTER``): those
    outside the standard library (directories STDLIB) first, the ones a reader looks for
    (the interpreter imports some of its own before any probe can start), each part sorted."""
    in_stdlib = stdlib_test(stdlib)
    paths = [f.path for f in files if f.at in HASHED_AFTER]
    return sorted(paths, key=lambda p: (in_stdlib(p), p))
