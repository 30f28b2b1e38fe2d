"""Turn what ``/proc`` and the probes show into ``verifier.model`` process reports."""

from __future__ import annotations

import dataclasses
import os

from verifier.agent.containers import container_of
from verifier.errors import NotPythonProcess, ProcessAccessDenied, UnavailableError
from verifier.evidence.distindex import DistIndex
from verifier.evidence.hashing import Hasher
from verifier.evidence.judge import Judgement, judge
from verifier.evidence.native import native_mappings
from verifier.evidence.probe_reader import JournalCache, ProbeState
from verifier.evidence.process import ProcessEvidence, read_process
from verifier.evidence.procfs import ProcFS
from verifier.model import (
    FileEntry,
    HookEvidence,
    LogLine,
    ProcessKey,
    ProcessReport,
    RunnerEvidence,
    SpecEvidence,
    StepEvidence,
)

# Converted manifests by digest: an unchanged manifest is not converted again every report.
_FILE_ENTRIES: dict[str, tuple[FileEntry, ...]] = {}


def is_vllm_candidate(ev: ProcessEvidence) -> bool:
    """A process the agent reports: it has a probe, or its command line names vLLM."""
    if ev.probe is not None:
        return True
    return any("vllm" in a.lower() for a in ev.identity.cmdline)


def discover(
    procfs: ProcFS,
    root_pid: int | None = None,
    cache: JournalCache | None = None,
    refused: list[str] | None = None,
) -> list[ProcessEvidence]:
    """Every vLLM process visible (under ROOT_PID if given), the agent itself excluded.
    CACHE: keep parsed probe journals between calls (only appended records are read).
    REFUSED: where to note the vLLM processes /proc would not let the agent read (they would
    otherwise vanish from the report as if they did not exist)."""
    pids = procfs.descendants(root_pid) if root_pid else sorted(procfs.parents())
    out = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            ev = read_process(procfs, pid, cache)
        except (ProcessAccessDenied, PermissionError) as e:
            # The process named with --pid is noted whatever its command line: it was asked for.
            what = "(--pid)" if pid == root_pid else "looks like vLLM"
            if refused is not None and (pid == root_pid or _names_vllm(procfs, pid)):
                refused.append(
                    f"pid {pid} {what} but /proc refused to show it ({e}): the agent "
                    "needs SYS_PTRACE and to run as the same user (root) in the process's "
                    "PID namespace"
                )
            continue
        except (NotPythonProcess, UnavailableError, OSError, ValueError):
            continue
        if is_vllm_candidate(ev):
            out.append(ev)
    return out


def _names_vllm(procfs: ProcFS, pid: int) -> bool:
    """Whether PID's command line (readable without ptrace rights) mentions vLLM."""
    try:
        cmdline = (procfs.root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm" in cmdline.lower()


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _spec(p: ProbeState) -> SpecEvidence | None:
    """The probe's speculation record (None when its config was not readable)."""
    sp = p.spec
    if sp is None or sp.on is None:
        return None
    return SpecEvidence(
        on=sp.on,
        method=sp.method,
        num_speculative_tokens=sp.num_speculative_tokens,
        steps=sp.steps,
        drafts=sp.drafts,
        draft_tokens=sp.draft_tokens,
        accepted_tokens=sp.accepted_tokens,
        emitted_tokens=sp.emitted_tokens,
        unread_steps=sp.unread_steps,
        accepted_per_position=sp.accepted_per_position,
    )


def _probe_parts(
    p: ProbeState,
) -> tuple[RunnerEvidence | None, StepEvidence, tuple[HookEvidence, ...], tuple[FileEntry, ...]]:
    runner = None
    if p.runner is not None:
        runner = RunnerEvidence(p.runner.cls, p.runner.file, p.runner.sha256, p.runner.mro)
    s, g = p.steps, p.graph
    eager = g.get("enforce_eager")
    steps = StepEvidence(
        s.total,
        s.productive,
        s.empty,
        s.tokens_scheduled,
        s.requests_scheduled,
        s.requests_max,
        s.last_step_unix_ns,
        prefill_steps=s.prefill_steps,
        decode_steps=s.decode_steps,
        prefill_tokens=s.prefill_tokens,
        decode_tokens=s.decode_tokens,
        dummy_steps=s.dummy_steps,
        compilation_mode=_opt_str(g.get("compilation_mode")),
        cudagraph_mode=_opt_str(g.get("cudagraph_mode")),
        enforce_eager=eager if isinstance(eager, bool) else None,
        spec=_spec(p),
        raised=s.raised,
    )
    hooks = tuple(
        HookEvidence(
            name=h.name,
            target=h.target,
            module_loaded=h.module_loaded,
            wrapped=h.wrapped,
            owner=h.owner,
            how=h.how,
            unresolved=h.unresolved,
            instantiated_class=h.instantiated_class,
            fired=h.fired,
            fired_productive=h.fired_productive,
            first_step=h.first_step,
            last_step=h.last_step,
            fired_prefill=h.fired_prefill,
            fired_decode=h.fired_decode,
            fired_outside=h.fired_outside,
            device_fired=h.device_fired,
            device_base=h.device_base,
            device_base_step=h.device_base_step,
        )
        for h in p.hooks
    )
    files = _FILE_ENTRIES.get(p.manifest_digest)
    if files is None:
        files = tuple(FileEntry(f.path, f.sha256, f.size, f.kind, f.module, f.at) for f in p.files)
        if len(_FILE_ENTRIES) > 256:
            _FILE_ENTRIES.clear()
        _FILE_ENTRIES[p.manifest_digest] = files
    return runner, steps, hooks, files


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
    manifest-only part (origins, bytecode) is kept while the manifest is unchanged."""
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
        native_mappings=mappings,
        roles=tuple(ev.roles),
    )
    if ev.probe is None:
        return base, None
    runner, steps, hooks, files = _probe_parts(ev.probe)
    now = None
    if runner is not None and runner.file:
        now = hasher.hash_file(str(procfs.in_root(ident.pid, runner.file))).sha256
    judged = previous or judge(
        procfs,
        ident.pid,
        ev.probe,
        files,
        hasher,
        start_time=ident.start_time,
        index=index,
        reuse=reuse,
    )
    report = dataclasses.replace(
        base,
        probe_errors=tuple(f"[{e.get('where')}] {e.get('msg')}" for e in ev.probe.errors),
        runner=runner,
        steps=steps,
        hooks=hooks,
        manifest_digest=ev.probe.manifest_digest,
        files=files,
        runner_file_sha256_now=now,
        disagreements=judged.disagreements,
        provenance=judged.provenance,
        drift=judged.drift,
        runner_log=tuple(LogLine(x.level, x.logger, x.message) for x in ev.probe.runner_log),
    )
    return report, judged


def still_running(procfs: ProcFS, ev: ProcessEvidence) -> bool:
    """Whether the process EV describes is still there (same pid, same start)."""
    try:
        return procfs.identity(ev.identity.pid).start_ticks == ev.identity.start_ticks
    except (UnavailableError, OSError):
        return False
