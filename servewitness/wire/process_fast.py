"""A process's fast conversion (``process_fast``): the checks of
``wire.process``'s checked path for the common process (three or more per report, every
report, and again for every report a follower reads) without a field path built per field, a
size check per list or a generator per empty list; None when anything is unusual (a
manifest's files, a value or a count a check refuses, a speculation record), and
``process.process_from_pb`` then converts with the checked path, which names the field.
Nested evidence (provenance, code, drift, ...) is converted by the checked converters, its
path built only when it is there. Also the few checked converters both paths share.
``tests/test_process_fast.py`` holds the two paths to the same answers."""

from __future__ import annotations

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    EVIDENCE_PROBLEM_IDS,
    HASHED_AFTER_SHOWN,
    MAX_CHILDREN,
    CodeChain,
    Drift,
    EvidenceProblem,
    FileDisagreement,
    HookEvidence,
    LogLine,
    NativeMapping,
    ProcessKey,
    ProcessReport,
    Provenance,
    RunnerEvidence,
    StackWitness,
    StepEvidence,
)
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire.code import chain_from_pb
from servewitness.wire.files import (
    disagreement_from_pb,
    drift_from_pb,
    native_from_pb,
    provenance_from_pb,
)

MAX_ROLES = 16  # roles of one process (vLLM's layouts give at most three)


def witness_from_pb(msg: pb.StackWitness, at: str) -> StackWitness:
    samples = F.count(msg.samples, f"{at}.samples")
    hits = F.count(msg.runner_file_hits, f"{at}.runner_file_hits")
    if hits > samples:
        F.fail(f"{at}.runner_file_hits", f"{hits} hits in {samples} samples")
    return StackWitness(
        samples=samples,
        runner_file_hits=hits,
        runner_file=msg.runner_file if msg.HasField("runner_file") else None,
        top_files=tuple(msg.top_files),
        error=msg.error if msg.HasField("error") else None,
    )


def problem_from_pb(msg: pb.EvidenceProblem, at: str) -> EvidenceProblem:
    if msg.id not in EVIDENCE_PROBLEM_IDS:
        F.fail(f"{at}.id", f"unknown evidence problem {msg.id!r}")
    return EvidenceProblem(id=msg.id, detail=F.text(msg.detail, f"{at}.detail"))


_NESTED = ("native_mappings", "disagreements", "drift", "runner_log", "evidence_problems", "code")


def process_fast(msg: pb.ProcessReport, at: str) -> ProcessReport | None:  # noqa: PLR0911, PLR0912
    if msg.files or msg.files_included or not msg.HasField("key"):
        return None
    k = msg.key
    pid, ticks = k.pid, k.start_ticks
    ns_pid, ppid, start, role = msg.ns_pid, msg.ppid, msg.start_time, msg.role
    if pid < 1 or ticks < 0 or ns_pid < 0 or ppid < 0 or not role:
        return None
    if not 0 <= start <= F.MAX_UNIX_TIME:  # False for NaN
        return None
    lists = L.LIST_ENTRIES.value
    cmdline, errors, roles, hooks = msg.cmdline, msg.probe_errors, msg.roles, msg.hooks
    if len(cmdline) > lists or len(errors) > lists or len(hooks) > L.HOOKS_PER_PROCESS.value:
        return None
    if len(roles) > MAX_ROLES or not all(roles) or any(len(r) > F.MAX_TEXT for r in roles):
        return None
    if any(len(getattr(msg, name)) > lists for name in _NESTED):
        return None
    rank = None
    if msg.HasField("rank"):
        rank = msg.rank
        if rank < 0:
            return None
    runner = None
    if msg.HasField("runner"):
        r = msg.runner
        if not r.cls or len(r.mro) > lists:
            return None
        sha = r.sha256 if r.HasField("sha256") else None
        if sha is not None and not F.is_sha256_hex(sha):
            return None
        runner = RunnerEvidence(r.cls, r.file if r.HasField("file") else None, sha, tuple(r.mro))
    steps = None
    if msg.HasField("steps"):
        steps = steps_fast(msg.steps)
        if steps is None:
            return None
    hook_list = []
    for h in hooks:
        got = hook_fast(h)
        if got is None:
            return None
        hook_list.append(got)
    digest = None
    if msg.HasField("manifest_digest"):
        digest = msg.manifest_digest
        if not F.is_digest(digest):
            return None
    now = None
    if msg.HasField("runner_file_sha256_now"):
        now = msg.runner_file_sha256_now
        if not F.is_sha256_hex(now):
            return None
    after, after_count = msg.hashed_after, msg.hashed_after_count
    started = msg.probe_started_ticks if msg.HasField("probe_started_ticks") else None
    if started is not None and started < ticks:
        return None
    children = _children(msg)
    if isinstance(children, bool):
        return None  # the checked converter says why
    if after_count < 0 or len(after) > min(after_count, HASHED_AFTER_SHOWN) or not all(after):
        return None
    if msg.HasField("stack_witness") and len(msg.stack_witness.top_files) > lists:
        return None
    if msg.HasField("provenance"):
        prov = msg.provenance
        if len(prov.files) > lists or max(len(prov.distributions), len(prov.contents)) > lists:
            return None
    natives, disagreements, provenance, drift, witness, problems, code = nested(msg, at)
    return ProcessReport(
        key=ProcessKey(k.boot_id, pid, ticks),
        ns_pid=ns_pid,
        ppid=ppid,
        start_time=start,
        role=role,
        rank=rank,
        container_id=msg.container_id if msg.HasField("container_id") else None,
        cmdline=tuple(cmdline),
        exe=msg.exe,
        probe_present=msg.probe_present,
        probe_errors=tuple(errors),
        runner=runner,
        steps=steps,
        hooks=tuple(hook_list),
        manifest_digest=digest,
        files=None,
        native_mappings=natives,
        runner_file_sha256_now=now,
        disagreements=disagreements,
        provenance=provenance,
        drift=drift,
        stack_witness=witness,
        runner_log=tuple(LogLine(x.level, x.logger, x.message) for x in msg.runner_log)
        if msg.runner_log
        else (),
        roles=tuple(sorted(set(roles))) if roles else (),
        evidence_problems=problems,
        code=code,
        hashed_after=tuple(after),
        hashed_after_count=after_count,
        probe_started_ticks=started,
        children=children,
    )


def _children(msg: pb.ProcessReport) -> tuple[tuple[int, int], ...] | bool | None:
    """``children`` (None: absent), or False when the checked converter must say why."""
    if not msg.HasField("children"):
        return None
    starts = msg.children.starts
    if len(starts) > MAX_CHILDREN or any(c.pid < 1 or c.start_ticks < 0 for c in starts):
        return False
    return tuple((c.pid, c.start_ticks) for c in starts)


_Nested = tuple[
    tuple[NativeMapping, ...],
    tuple[FileDisagreement, ...],
    Provenance | None,
    tuple[Drift, ...],
    StackWitness | None,
    tuple[EvidenceProblem, ...],
    tuple[CodeChain, ...],
]


def nested(msg: pb.ProcessReport, at: str) -> _Nested:
    """MSG's nested evidence by the checked converters, in the checked path's order (so the
    same first error), a field path built only for what is there."""
    natives, disagreements, drift, problems, code = (
        msg.native_mappings, msg.disagreements, msg.drift, msg.evidence_problems, msg.code
    )  # fmt: skip
    return (
        tuple(native_from_pb(n, f"{at}.native_mappings[{i}]") for i, n in enumerate(natives))
        if natives
        else (),
        tuple(
            disagreement_from_pb(d, f"{at}.disagreements[{i}]") for i, d in enumerate(disagreements)
        )
        if disagreements
        else (),
        provenance_from_pb(msg.provenance, f"{at}.provenance")
        if msg.HasField("provenance")
        else None,
        tuple(drift_from_pb(d, f"{at}.drift[{i}]") for i, d in enumerate(drift)) if drift else (),
        witness_from_pb(msg.stack_witness, f"{at}.stack_witness")
        if msg.HasField("stack_witness")
        else None,
        tuple(problem_from_pb(x, f"{at}.evidence_problems[{i}]") for i, x in enumerate(problems))
        if problems
        else (),
        tuple(chain_from_pb(c, f"{at}.code[{i}]") for i, c in enumerate(code)) if code else (),
    )


def steps_fast(msg: pb.StepEvidence) -> StepEvidence | None:
    if msg.HasField("spec"):
        return None  # speculation: the checked path
    counts = (
        msg.total, msg.productive, msg.empty, msg.tokens_scheduled, msg.requests_scheduled,
        msg.requests_max, msg.last_step_unix_ns, msg.prefill_steps, msg.decode_steps,
        msg.prefill_tokens, msg.decode_tokens, msg.dummy_steps,
    )  # fmt: skip
    raised = msg.raised
    if min(counts) < 0 or raised < 0:
        return None
    return StepEvidence(
        *counts,
        compilation_mode=msg.compilation_mode if msg.HasField("compilation_mode") else None,
        cudagraph_mode=msg.cudagraph_mode if msg.HasField("cudagraph_mode") else None,
        enforce_eager=msg.enforce_eager if msg.HasField("enforce_eager") else None,
        spec=None,
        raised=raised,
    )


def hook_fast(msg: pb.HookEvidence) -> HookEvidence | None:
    name = msg.name
    fired, productive = msg.fired, msg.fired_productive
    prefill, decode, outside = msg.fired_prefill, msg.fired_decode, msg.fired_outside
    if not name or min(fired, productive, prefill, decode, outside) < 0:
        return None
    has = msg.HasField
    first = msg.first_step if has("first_step") else None
    last = msg.last_step if has("last_step") else None
    dev = msg.device_fired if has("device_fired") else None
    base = msg.device_base if has("device_base") else None
    base_step = msg.device_base_step if has("device_base_step") else None
    for v in (first, last, dev, base, base_step):
        if v is not None and v < 0:
            return None
    return HookEvidence(
        name, msg.target, msg.module_loaded, msg.wrapped,
        msg.owner if has("owner") else None,
        msg.how if has("how") else None,
        msg.unresolved if has("unresolved") else None,
        msg.instantiated_class if has("instantiated_class") else None,
        fired, productive, first, last, prefill, decode, outside, dev, base, base_step,
        msg.source,
        msg.device if has("device") else None,
    )  # fmt: skip
