"""``ProcessReport`` and its parts (runner, steps, speculation, hooks, stack witness) to and
from their messages; what the agent judged of its files (manifest entries, native mappings,
disagreements, provenance, drift) is in ``files.py``, code chains in ``code.py``."""

from __future__ import annotations

from collections.abc import Iterable

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    HASHED_AFTER_SHOWN,
    MAX_CHILDREN,
    FileEntry,
    HookEvidence,
    LogLine,
    ProcessKey,
    ProcessReport,
    RunnerEvidence,
    SpecEvidence,
    StackWitness,
    StepEvidence,
)
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire.code import chain_from_pb, chain_to_pb
from servewitness.wire.files import (
    disagreement_from_pb,
    disagreement_to_pb,
    drift_from_pb,
    drift_to_pb,
    file_from_pb,
    file_to_pb,
    native_from_pb,
    native_to_pb,
    provenance_from_pb,
    provenance_to_pb,
)
from servewitness.wire.process_fast import (
    MAX_ROLES,
    problem_from_pb,
    process_fast,
    witness_from_pb,
)


def key_to_pb(key: ProcessKey) -> pb.ProcessKey:
    return pb.ProcessKey(boot_id=key.boot_id, pid=key.pid, start_ticks=key.start_ticks)


def key_from_pb(msg: pb.ProcessKey, at: str) -> ProcessKey:
    return ProcessKey(
        boot_id=msg.boot_id,  # "" when the agent could not read it
        pid=F.count(msg.pid, f"{at}.pid", minimum=1),
        start_ticks=F.count(msg.start_ticks, f"{at}.start_ticks"),
    )


def _runner_to_pb(r: RunnerEvidence) -> pb.RunnerEvidence:
    return pb.RunnerEvidence(cls=r.cls, file=r.file, sha256=r.sha256, mro=r.mro)


def _runner_from_pb(msg: pb.RunnerEvidence, at: str) -> RunnerEvidence:
    return RunnerEvidence(
        cls=F.required(msg.cls, f"{at}.cls"),
        file=msg.file if msg.HasField("file") else None,
        sha256=F.sha256_hex(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
        mro=tuple(msg.mro),
    )


def _steps_to_pb(s: StepEvidence) -> pb.StepEvidence:
    return pb.StepEvidence(
        total=s.total,
        productive=s.productive,
        empty=s.empty,
        tokens_scheduled=s.tokens_scheduled,
        requests_scheduled=s.requests_scheduled,
        requests_max=s.requests_max,
        last_step_unix_ns=s.last_step_unix_ns,
        prefill_steps=s.prefill_steps,
        decode_steps=s.decode_steps,
        prefill_tokens=s.prefill_tokens,
        decode_tokens=s.decode_tokens,
        dummy_steps=s.dummy_steps,
        compilation_mode=s.compilation_mode,
        cudagraph_mode=s.cudagraph_mode,
        enforce_eager=s.enforce_eager,
        spec=None if s.spec is None else _spec_to_pb(s.spec),
        raised=s.raised,
    )


def _spec_to_pb(s: SpecEvidence) -> pb.SpecEvidence:
    return pb.SpecEvidence(
        on=s.on,
        method=s.method,
        num_speculative_tokens=s.num_speculative_tokens,
        steps=s.steps,
        drafts=s.drafts,
        draft_tokens=s.draft_tokens,
        accepted_tokens=s.accepted_tokens,
        emitted_tokens=s.emitted_tokens,
        unread_steps=s.unread_steps,
        accepted_per_position=s.accepted_per_position,
    )


def _spec_from_pb(msg: pb.SpecEvidence, at: str) -> SpecEvidence:
    # Counters read while steps run: no cross-field checks (a read between two slot updates
    # of one step is not a malformed report).
    return SpecEvidence(
        on=msg.on if msg.HasField("on") else None,
        method=msg.method if msg.HasField("method") else None,
        num_speculative_tokens=(
            F.count(msg.num_speculative_tokens, f"{at}.num_speculative_tokens")
            if msg.HasField("num_speculative_tokens")
            else None
        ),
        steps=F.count(msg.steps, f"{at}.steps"),
        drafts=F.count(msg.drafts, f"{at}.drafts"),
        draft_tokens=F.count(msg.draft_tokens, f"{at}.draft_tokens"),
        accepted_tokens=F.count(msg.accepted_tokens, f"{at}.accepted_tokens"),
        emitted_tokens=F.count(msg.emitted_tokens, f"{at}.emitted_tokens"),
        unread_steps=F.count(msg.unread_steps, f"{at}.unread_steps"),
        accepted_per_position=tuple(
            F.count(v, f"{at}.accepted_per_position[{i}]")
            for i, v in enumerate(msg.accepted_per_position)
        ),
    )


def _steps_from_pb(msg: pb.StepEvidence, at: str) -> StepEvidence:
    return StepEvidence(
        total=F.count(msg.total, f"{at}.total"),
        productive=F.count(msg.productive, f"{at}.productive"),
        empty=F.count(msg.empty, f"{at}.empty"),
        tokens_scheduled=F.count(msg.tokens_scheduled, f"{at}.tokens_scheduled"),
        requests_scheduled=F.count(msg.requests_scheduled, f"{at}.requests_scheduled"),
        requests_max=F.count(msg.requests_max, f"{at}.requests_max"),
        last_step_unix_ns=F.count(msg.last_step_unix_ns, f"{at}.last_step_unix_ns"),
        prefill_steps=F.count(msg.prefill_steps, f"{at}.prefill_steps"),
        decode_steps=F.count(msg.decode_steps, f"{at}.decode_steps"),
        prefill_tokens=F.count(msg.prefill_tokens, f"{at}.prefill_tokens"),
        decode_tokens=F.count(msg.decode_tokens, f"{at}.decode_tokens"),
        dummy_steps=F.count(msg.dummy_steps, f"{at}.dummy_steps"),
        compilation_mode=msg.compilation_mode if msg.HasField("compilation_mode") else None,
        cudagraph_mode=msg.cudagraph_mode if msg.HasField("cudagraph_mode") else None,
        enforce_eager=msg.enforce_eager if msg.HasField("enforce_eager") else None,
        spec=_spec_from_pb(msg.spec, f"{at}.spec") if msg.HasField("spec") else None,
        raised=F.count(msg.raised, f"{at}.raised"),
    )


def _hook_to_pb(h: HookEvidence) -> pb.HookEvidence:
    return pb.HookEvidence(
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
        source=h.source,
        device=h.device,
    )


def _hook_from_pb(msg: pb.HookEvidence, at: str) -> HookEvidence:
    first = F.count(msg.first_step, f"{at}.first_step") if msg.HasField("first_step") else None
    last = F.count(msg.last_step, f"{at}.last_step") if msg.HasField("last_step") else None
    return HookEvidence(
        name=F.required(msg.name, f"{at}.name"),
        target=msg.target,
        module_loaded=msg.module_loaded,
        wrapped=msg.wrapped,
        owner=msg.owner if msg.HasField("owner") else None,
        how=msg.how if msg.HasField("how") else None,
        unresolved=msg.unresolved if msg.HasField("unresolved") else None,
        instantiated_class=msg.instantiated_class if msg.HasField("instantiated_class") else None,
        fired=F.count(msg.fired, f"{at}.fired"),
        fired_productive=F.count(msg.fired_productive, f"{at}.fired_productive"),
        first_step=first,
        last_step=last,
        fired_prefill=F.count(msg.fired_prefill, f"{at}.fired_prefill"),
        fired_decode=F.count(msg.fired_decode, f"{at}.fired_decode"),
        fired_outside=F.count(msg.fired_outside, f"{at}.fired_outside"),
        device_fired=(
            F.count(msg.device_fired, f"{at}.device_fired")
            if msg.HasField("device_fired")
            else None
        ),
        device_base=(
            F.count(msg.device_base, f"{at}.device_base") if msg.HasField("device_base") else None
        ),
        device_base_step=(
            F.count(msg.device_base_step, f"{at}.device_base_step")
            if msg.HasField("device_base_step")
            else None
        ),
        source=msg.source,
        device=msg.device if msg.HasField("device") else None,
    )


def process_to_pb(p: ProcessReport) -> pb.ProcessReport:
    r, s = p.runner, p.steps
    return pb.ProcessReport(
        key=key_to_pb(p.key),
        ns_pid=p.ns_pid,
        ppid=p.ppid,
        start_time=p.start_time,
        role=p.role,
        rank=p.rank,
        container_id=p.container_id,
        cmdline=p.cmdline,
        exe=p.exe,
        probe_present=p.probe_present,
        probe_errors=p.probe_errors,
        runner=None if r is None else _runner_to_pb(r),
        steps=None if s is None else _steps_to_pb(s),
        hooks=[_hook_to_pb(h) for h in p.hooks],
        manifest_digest=p.manifest_digest,
        files_included=p.files is not None,
        files=[file_to_pb(f) for f in p.files or ()],
        native_mappings=[native_to_pb(n) for n in p.native_mappings],
        runner_file_sha256_now=p.runner_file_sha256_now,
        disagreements=[disagreement_to_pb(d) for d in p.disagreements],
        provenance=None if p.provenance is None else provenance_to_pb(p.provenance),
        drift=[drift_to_pb(d) for d in p.drift],
        stack_witness=None if p.stack_witness is None else _witness_to_pb(p.stack_witness),
        runner_log=[
            pb.LogLine(level=x.level, logger=x.logger, message=x.message) for x in p.runner_log
        ],
        roles=list(p.roles),
        evidence_problems=[
            pb.EvidenceProblem(id=x.id, detail=x.detail) for x in p.evidence_problems
        ],
        code=[chain_to_pb(c) for c in p.code],
        hashed_after=list(p.hashed_after),
        hashed_after_count=p.hashed_after_count,
        probe_started_ticks=p.probe_started_ticks,
        children=None
        if p.children is None
        else pb.ChildStarts(starts=[pb.ChildStart(pid=c, start_ticks=t) for c, t in p.children]),
    )


def _witness_to_pb(w: StackWitness) -> pb.StackWitness:
    return pb.StackWitness(
        samples=w.samples,
        runner_file_hits=w.runner_file_hits,
        runner_file=w.runner_file,
        top_files=w.top_files,
        error=w.error,
    )


_LISTS = (
    "cmdline",
    "probe_errors",
    "native_mappings",
    "disagreements",
    "drift",
    "runner_log",
    "evidence_problems",
    "code",
)


def _check_sizes(msg: pb.ProcessReport, at: str) -> None:
    """Every repeated field of a process within its limit, before any entry is converted."""
    L.at_most(L.HOOKS_PER_PROCESS, len(msg.hooks), f"{at}.hooks")
    L.at_most(L.FILES_PER_MANIFEST, len(msg.files), f"{at}.files")
    for name in _LISTS:
        L.at_most(L.LIST_ENTRIES, len(getattr(msg, name)), f"{at}.{name}")
    if msg.HasField("provenance"):
        L.at_most(L.LIST_ENTRIES, len(msg.provenance.files), f"{at}.provenance.files")
        dists = len(msg.provenance.distributions)
        L.at_most(L.LIST_ENTRIES, dists, f"{at}.provenance.distributions")
        contents = len(msg.provenance.contents)
        L.at_most(L.LIST_ENTRIES, contents, f"{at}.provenance.contents")
    if msg.HasField("stack_witness"):
        L.at_most(L.LIST_ENTRIES, len(msg.stack_witness.top_files), f"{at}.stack_witness")
    if msg.HasField("runner"):
        L.at_most(L.LIST_ENTRIES, len(msg.runner.mro), f"{at}.runner.mro")
    path_bytes = sum(len(f.path.encode()) for f in msg.files)
    L.at_most(L.MANIFEST_PATH_BYTES, path_bytes, f"{at}.files[*].path")


def _files_from_pb(msg: pb.ProcessReport, at: str) -> tuple[FileEntry, ...]:
    """A manifest's files as sent (``files_included``). Refused: a path listed twice (the
    index keeps one entry of a path, the ledgered list both: the two would answer an audit
    differently). Whether the files match a digest, and that a digest comes with them, is the
    verifier's check (``server/service.py``)."""
    files = tuple(file_from_pb(f, f"{at}.files[{i}]") for i, f in enumerate(msg.files))
    if len({f.path for f in files}) != len(files):
        seen: set[str] = set()
        for i, f in enumerate(files):
            if f.path in seen:
                F.fail(f"{at}.files[{i}].path", f"{f.path!r} is listed twice in one manifest")
            seen.add(f.path)
    return files


def process_from_pb(msg: pb.ProcessReport, at: str) -> ProcessReport:
    fast = process_fast(msg, at)
    if fast is not None:
        return fast
    return _process_checked(msg, at)


def _process_checked(msg: pb.ProcessReport, at: str) -> ProcessReport:
    if not msg.HasField("key"):
        F.fail(f"{at}.key", "required, but absent")
    if msg.files and not msg.files_included:
        F.fail(f"{at}.files", f"{len(msg.files)} entries sent with files_included false")
    _check_sizes(msg, at)
    digest = msg.manifest_digest if msg.HasField("manifest_digest") else None
    return ProcessReport(
        key=key_from_pb(msg.key, f"{at}.key"),
        ns_pid=F.count(msg.ns_pid, f"{at}.ns_pid"),
        ppid=F.count(msg.ppid, f"{at}.ppid"),
        start_time=F.finite_time(msg.start_time, f"{at}.start_time"),
        role=F.required(msg.role, f"{at}.role"),
        rank=F.count(msg.rank, f"{at}.rank") if msg.HasField("rank") else None,
        container_id=msg.container_id if msg.HasField("container_id") else None,
        cmdline=tuple(msg.cmdline),
        exe=msg.exe,
        probe_present=msg.probe_present,
        probe_errors=tuple(msg.probe_errors),
        runner=_runner_from_pb(msg.runner, f"{at}.runner") if msg.HasField("runner") else None,
        steps=_steps_from_pb(msg.steps, f"{at}.steps") if msg.HasField("steps") else None,
        hooks=tuple(_hook_from_pb(h, f"{at}.hooks[{i}]") for i, h in enumerate(msg.hooks)),
        manifest_digest=None if digest is None else F.digest(digest, f"{at}.manifest_digest"),
        files=_files_from_pb(msg, at) if msg.files_included else None,
        native_mappings=tuple(
            native_from_pb(n, f"{at}.native_mappings[{i}]")
            for i, n in enumerate(msg.native_mappings)
        ),
        runner_file_sha256_now=(
            F.sha256_hex(msg.runner_file_sha256_now, f"{at}.runner_file_sha256_now")
            if msg.HasField("runner_file_sha256_now")
            else None
        ),
        disagreements=tuple(
            disagreement_from_pb(d, f"{at}.disagreements[{i}]")
            for i, d in enumerate(msg.disagreements)
        ),
        provenance=(
            provenance_from_pb(msg.provenance, f"{at}.provenance")
            if msg.HasField("provenance")
            else None
        ),
        drift=tuple(drift_from_pb(d, f"{at}.drift[{i}]") for i, d in enumerate(msg.drift)),
        stack_witness=(
            witness_from_pb(msg.stack_witness, f"{at}.stack_witness")
            if msg.HasField("stack_witness")
            else None
        ),
        runner_log=tuple(LogLine(x.level, x.logger, x.message) for x in msg.runner_log),
        roles=_roles_from_pb(msg.roles, f"{at}.roles"),
        evidence_problems=tuple(
            problem_from_pb(x, f"{at}.evidence_problems[{i}]")
            for i, x in enumerate(msg.evidence_problems)
        ),
        code=tuple(chain_from_pb(c, f"{at}.code[{i}]") for i, c in enumerate(msg.code)),
        hashed_after=_hashed_after_from_pb(msg, at),
        hashed_after_count=msg.hashed_after_count,
        probe_started_ticks=probe_started_from_pb(msg, at),
        children=children_from_pb(msg, at),
    )


def children_from_pb(msg: pb.ProcessReport, at: str) -> tuple[tuple[int, int], ...] | None:
    """``children``: absent is not known; each pid positive, each start tick a count."""
    if not msg.HasField("children"):
        return None
    starts = msg.children.starts
    if len(starts) > MAX_CHILDREN:
        F.fail(f"{at}.children", f"{len(starts)} entries, more than a probe journals")
    for i, c in enumerate(starts):
        if c.pid < 1 or c.start_ticks < 0:
            F.fail(f"{at}.children[{i}]", "a pid below 1 or a negative start")
    return tuple((c.pid, c.start_ticks) for c in starts)


def probe_started_from_pb(msg: pb.ProcessReport, at: str) -> int | None:
    """``probe_started_ticks``: absent, or at or after the process's own start."""
    if not msg.HasField("probe_started_ticks"):
        return None
    if msg.probe_started_ticks < msg.key.start_ticks:
        F.fail(f"{at}.probe_started_ticks", "before the process started")
    return msg.probe_started_ticks


def _hashed_after_from_pb(msg: pb.ProcessReport, at: str) -> tuple[str, ...]:
    F.count(msg.hashed_after_count, f"{at}.hashed_after_count")
    paths = F.texts(msg.hashed_after, f"{at}.hashed_after")
    if len(paths) > msg.hashed_after_count:
        F.fail(f"{at}.hashed_after", f"{len(paths)} paths, more than hashed_after_count")
    if len(paths) > HASHED_AFTER_SHOWN:
        F.fail(f"{at}.hashed_after", f"{len(paths)} paths, more than {HASHED_AFTER_SHOWN}")
    return paths


def _roles_from_pb(values: Iterable[str], at: str) -> tuple[str, ...]:
    roles = F.texts(values, at)
    if len(roles) > MAX_ROLES:
        F.fail(at, f"more than {MAX_ROLES} roles")
    for i, r in enumerate(roles):
        F.text(r, f"{at}[{i}]")
    return tuple(sorted(set(roles)))
