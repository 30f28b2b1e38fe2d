"""One process's report: its probe's evidence (``verifier.model`` types, as the reader
returns them) with the agent's own ``/proc`` evidence added and the files judged. The agent
and the local commands (``inspect``, ``diff``, ``policy init``) build reports here alike."""

from __future__ import annotations

import dataclasses

from verifier.evidence.codecheck import check_chains
from verifier.evidence.container import container_of
from verifier.evidence.distindex import DistIndex
from verifier.evidence.hashing import Hasher
from verifier.evidence.judge import Judgement, dist_index, judge
from verifier.evidence.native import native_mappings
from verifier.evidence.process import ProcessEvidence
from verifier.evidence.procfs import ProcFS
from verifier.model import (
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    EvidenceProblem,
    ProcessKey,
    ProcessReport,
)


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
) -> tuple[ProcessReport, Judgement | None]:
    """One process's report with the agent's own /proc evidence added. HASHER: reuse one so
    unchanged files are answered from its cache. PREVIOUS: the last judgement of its files, to
    reuse instead of re-checking every file (None: check now). INDEX: the process's
    distribution index, to reuse (see ``judge.dist_index``). REUSE: an earlier judgement whose
    manifest-only part (origins, bytecode) is kept while the manifest is unchanged. The code
    that runs each step method and hook target is verified every time (``codecheck``)."""
    ident = ev.identity
    ref = container_of(procfs, ident.pid)
    container = ref.id if ref else None
    hasher = hasher or Hasher()
    mappings = native_mappings(procfs, ident.pid, hasher)
    base = ProcessReport(
        key=ProcessKey(ident.boot_id, ident.pid, ident.start_ticks),
        ns_pid=ident.ns_pid,
        ppid=ident.ppid,
        start_time=ident.start_time,
        role=ev.role,
        rank=ev.rank,
        container_id=container,
        cmdline=ident.cmdline,
        exe=ident.exe,
        probe_present=ev.probe is not None,
        evidence_problems=tuple(EvidenceProblem(EVIDENCE_PROBE_UNBOUND, x) for x in ev.unbound),
        native_mappings=mappings,
        roles=tuple(ev.roles),
    )
    probe = ev.probe
    if probe is None:
        return base, None
    index = index or dist_index(procfs, ident.pid)
    runner = probe.runner
    now = None
    if runner is not None and runner.file:
        now = hasher.hash_file(str(procfs.in_root(ident.pid, runner.file))).sha256
    judged = previous or judge(
        procfs,
        ident.pid,
        probe,
        probe.files,
        hasher,
        start_time=ident.start_time,
        index=index,
        reuse=reuse,
    )
    # What runs the step methods and hook targets: verified on every report (a chain can
    # change without any file changing; compiled files are cached).
    code, code_drift = check_chains(
        probe.code, probe.files, lambda path: procfs.in_root(ident.pid, path), index=index
    )
    drift = sorted((*judged.drift, *code_drift), key=lambda d: (d.id, d.path))
    report = dataclasses.replace(
        base,
        probe_errors=tuple(f"[{e.get('where')}] {e.get('msg')}" for e in probe.errors),
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
    )
    return report, judged
