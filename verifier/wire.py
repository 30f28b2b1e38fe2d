"""The only module that maps domain types to and from ``verifier.api.v1`` messages.

``*_to_pb`` builds a message from a domain value; ``*_from_pb`` turns a received message back
into one and raises :class:`WireError` (a usage error, exit code 2) naming the offending field
when the message cannot describe a valid value: a required field left empty, a negative count,
a malformed hash, an unspecified or unknown enum value. Proto3 cannot tell "absent" from
"zero" for plain scalars, so every domain ``None`` travels as an ``optional`` field and the one
``None``-versus-empty tuple (``ProcessReport.files``) as ``files_included``. Semantic checks (is
the nonce current, does the digest match the files) belong to the server, not here.

The domain types of the request envelopes that ``verifier.model`` has no type for (agent hello,
acknowledgements, run registration) are the small frozen dataclasses defined below.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from google.protobuf import json_format
from google.protobuf.message import DecodeError

from verifier.api.v1 import verifier_pb2 as pb
from verifier.errors import UsageError
from verifier.model import (
    DRIFT_IDS,
    ContainerInfo,
    Drift,
    FileDisagreement,
    FileEntry,
    FileOrigin,
    Finding,
    HookCount,
    HookEvidence,
    LogLine,
    NativeMapping,
    Origin,
    ProcessKey,
    ProcessReport,
    Provenance,
    RequestId,
    RequestSpan,
    RequestSpec,
    RunnerEvidence,
    RunVerdict,
    Severity,
    SpecEvidence,
    StackWitness,
    StepEvidence,
    TargetReport,
    TargetVerdict,
    Verdict,
)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The gRPC message size limit of the server and every client, both directions (a worker's
full manifest, tens of thousands of files, is a few MiB)."""

GRPC_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
"""Channel and server options that apply :data:`MAX_MESSAGE_BYTES`."""

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # verifier.manifest.merkle_root

_VERDICTS: dict[Verdict, pb.Verdict] = {
    Verdict.PASS: pb.VERDICT_PASS,
    Verdict.FAIL: pb.VERDICT_FAIL,
    Verdict.PENDING: pb.VERDICT_PENDING,
    Verdict.STALE: pb.VERDICT_STALE,
}
_SEVERITIES: dict[Severity, pb.Severity] = {
    Severity.ERROR: pb.SEVERITY_ERROR,
    Severity.PENDING: pb.SEVERITY_PENDING,
    Severity.WARNING: pb.SEVERITY_WARNING,
    Severity.INFO: pb.SEVERITY_INFO,
}
_VERDICTS_BACK: dict[int, Verdict] = {int(v): k for k, v in _VERDICTS.items()}
_SEVERITIES_BACK: dict[int, Severity] = {int(v): k for k, v in _SEVERITIES.items()}


class WireError(UsageError):
    """A received message that does not describe a valid domain value."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid {field}: {reason}")
        self.field = field  # path of the offending field, e.g. "report.processes[0].key.pid"
        self.reason = reason


# Envelope values that verifier.model has no type for --------------------------------------


@dataclass(frozen=True)
class AgentHello:
    agent_id: str
    targets: tuple[str, ...]  # the targets this agent reports on


@dataclass(frozen=True)
class HelloReply:
    nonce: str  # to echo in the next report
    report_interval_s: float
    last_seq: int = 0  # highest sequence number the verifier stored for this agent


@dataclass(frozen=True)
class ReportAck:
    accepted: bool
    seq: int  # the seq acknowledged
    nonce: str  # the nonce to echo in the next report
    need_manifests: tuple[str, ...] = ()  # digests whose files the agent must resend


@dataclass(frozen=True)
class RunRegistration:
    name: str
    policy_toml: str
    source: str = ""  # where the policy came from (a path or a description)


@dataclass(frozen=True)
class RegisteredRun:
    name: str
    policy_digest: str
    created_unix: float


@dataclass(frozen=True)
class RunSummary:
    name: str
    policy_digest: str
    created_unix: float
    verdict: Verdict  # latest verdict (PENDING until evidence arrives)


# Field checks (AT is the field's path for the error) ----------------------------------------


def _fail(at: str, reason: str) -> NoReturn:
    raise WireError(at, reason)


def _required(value: str, at: str) -> str:
    if not value:
        _fail(at, "required, but empty")
    return value


def _count(value: int, at: str, minimum: int = 0) -> int:
    if value < minimum:
        _fail(at, f"must be >= {minimum}, got {value}")
    return value


def _time(value: float, at: str) -> float:
    if not math.isfinite(value) or value < 0:
        _fail(at, f"must be a finite time >= 0, got {value}")
    return value


def _ratio(value: float, at: str) -> float:
    if not math.isfinite(value) or value < 0:
        _fail(at, f"must be a finite number >= 0, got {value}")
    return value


def _sha256(value: str, at: str) -> str:
    if not _SHA256_HEX.fullmatch(value):
        _fail(at, f"not a lowercase hex sha256: {value!r}")
    return value


def _digest(value: str, at: str) -> str:
    if not _DIGEST.fullmatch(value):
        _fail(at, f"not a manifest digest 'sha256:<hex>': {value!r}")
    return value


def verdict_to_pb(verdict: Verdict) -> pb.Verdict:
    return _VERDICTS[verdict]


def verdict_from_pb(value: int, at: str = "verdict") -> Verdict:
    if value == pb.VERDICT_UNSPECIFIED:
        _fail(at, "VERDICT_UNSPECIFIED is not a verdict")
    if value not in _VERDICTS_BACK:
        _fail(at, f"unknown Verdict value {value}")
    return _VERDICTS_BACK[value]


def severity_to_pb(severity: Severity) -> pb.Severity:
    return _SEVERITIES[severity]


def severity_from_pb(value: int, at: str = "severity") -> Severity:
    if value == pb.SEVERITY_UNSPECIFIED:
        _fail(at, "SEVERITY_UNSPECIFIED is not a severity")
    if value not in _SEVERITIES_BACK:
        _fail(at, f"unknown Severity value {value}")
    return _SEVERITIES_BACK[value]


def _texts(values: Iterable[str], at: str) -> tuple[str, ...]:
    return tuple(_required(v, f"{at}[{i}]") for i, v in enumerate(values))


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


# Reports -------------------------------------------------------------------------------------


def _key_to_pb(key: ProcessKey) -> pb.ProcessKey:
    return pb.ProcessKey(boot_id=key.boot_id, pid=key.pid, start_ticks=key.start_ticks)


def _key_from_pb(msg: pb.ProcessKey, at: str) -> ProcessKey:
    return ProcessKey(
        boot_id=msg.boot_id,  # "" when the agent could not read it
        pid=_count(msg.pid, f"{at}.pid", minimum=1),
        start_ticks=_count(msg.start_ticks, f"{at}.start_ticks"),
    )


def _runner_to_pb(r: RunnerEvidence) -> pb.RunnerEvidence:
    return pb.RunnerEvidence(cls=r.cls, file=r.file, sha256=r.sha256, mro=r.mro)


def _runner_from_pb(msg: pb.RunnerEvidence, at: str) -> RunnerEvidence:
    return RunnerEvidence(
        cls=_required(msg.cls, f"{at}.cls"),
        file=msg.file if msg.HasField("file") else None,
        sha256=_sha256(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
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
            _count(msg.num_speculative_tokens, f"{at}.num_speculative_tokens")
            if msg.HasField("num_speculative_tokens")
            else None
        ),
        steps=_count(msg.steps, f"{at}.steps"),
        drafts=_count(msg.drafts, f"{at}.drafts"),
        draft_tokens=_count(msg.draft_tokens, f"{at}.draft_tokens"),
        accepted_tokens=_count(msg.accepted_tokens, f"{at}.accepted_tokens"),
        emitted_tokens=_count(msg.emitted_tokens, f"{at}.emitted_tokens"),
        unread_steps=_count(msg.unread_steps, f"{at}.unread_steps"),
        accepted_per_position=tuple(
            _count(v, f"{at}.accepted_per_position[{i}]")
            for i, v in enumerate(msg.accepted_per_position)
        ),
    )


def _steps_from_pb(msg: pb.StepEvidence, at: str) -> StepEvidence:
    return StepEvidence(
        total=_count(msg.total, f"{at}.total"),
        productive=_count(msg.productive, f"{at}.productive"),
        empty=_count(msg.empty, f"{at}.empty"),
        tokens_scheduled=_count(msg.tokens_scheduled, f"{at}.tokens_scheduled"),
        requests_scheduled=_count(msg.requests_scheduled, f"{at}.requests_scheduled"),
        requests_max=_count(msg.requests_max, f"{at}.requests_max"),
        last_step_unix_ns=_count(msg.last_step_unix_ns, f"{at}.last_step_unix_ns"),
        prefill_steps=_count(msg.prefill_steps, f"{at}.prefill_steps"),
        decode_steps=_count(msg.decode_steps, f"{at}.decode_steps"),
        prefill_tokens=_count(msg.prefill_tokens, f"{at}.prefill_tokens"),
        decode_tokens=_count(msg.decode_tokens, f"{at}.decode_tokens"),
        dummy_steps=_count(msg.dummy_steps, f"{at}.dummy_steps"),
        compilation_mode=msg.compilation_mode if msg.HasField("compilation_mode") else None,
        cudagraph_mode=msg.cudagraph_mode if msg.HasField("cudagraph_mode") else None,
        enforce_eager=msg.enforce_eager if msg.HasField("enforce_eager") else None,
        spec=_spec_from_pb(msg.spec, f"{at}.spec") if msg.HasField("spec") else None,
        raised=_count(msg.raised, f"{at}.raised"),
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
    first = _count(msg.first_step, f"{at}.first_step") if msg.HasField("first_step") else None
    last = _count(msg.last_step, f"{at}.last_step") if msg.HasField("last_step") else None
    return HookEvidence(
        name=_required(msg.name, f"{at}.name"),
        target=msg.target,
        module_loaded=msg.module_loaded,
        wrapped=msg.wrapped,
        owner=msg.owner if msg.HasField("owner") else None,
        how=msg.how if msg.HasField("how") else None,
        unresolved=msg.unresolved if msg.HasField("unresolved") else None,
        instantiated_class=msg.instantiated_class if msg.HasField("instantiated_class") else None,
        fired=_count(msg.fired, f"{at}.fired"),
        fired_productive=_count(msg.fired_productive, f"{at}.fired_productive"),
        first_step=first,
        last_step=last,
        fired_prefill=_count(msg.fired_prefill, f"{at}.fired_prefill"),
        fired_decode=_count(msg.fired_decode, f"{at}.fired_decode"),
        fired_outside=_count(msg.fired_outside, f"{at}.fired_outside"),
        device_fired=(
            _count(msg.device_fired, f"{at}.device_fired") if msg.HasField("device_fired") else None
        ),
        device_base=(
            _count(msg.device_base, f"{at}.device_base") if msg.HasField("device_base") else None
        ),
        device_base_step=(
            _count(msg.device_base_step, f"{at}.device_base_step")
            if msg.HasField("device_base_step")
            else None
        ),
        source=msg.source,
        device=msg.device if msg.HasField("device") else None,
    )


def _file_to_pb(f: FileEntry) -> pb.FileEntry:
    return pb.FileEntry(
        path=f.path, sha256=f.sha256, size=f.size, kind=f.kind, module=f.module, at=f.at
    )


def _file_from_pb(msg: pb.FileEntry, at: str) -> FileEntry:
    return FileEntry(
        path=_required(msg.path, f"{at}.path"),
        sha256=_sha256(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
        size=_count(msg.size, f"{at}.size", minimum=-1),  # -1: size unknown (unreadable)
        kind=msg.kind,
        module=msg.module if msg.HasField("module") else None,
        at=msg.at,
    )


def _process_to_pb(p: ProcessReport) -> pb.ProcessReport:
    r, s = p.runner, p.steps
    return pb.ProcessReport(
        key=_key_to_pb(p.key),
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
        files=[_file_to_pb(f) for f in p.files or ()],
        native_mappings=[
            pb.NativeMapping(
                path=n.path,
                sha256=n.sha256,
                size=n.size,
                state=n.state,
                error=n.error,
                device=n.device,
                inode=n.inode,
            )
            for n in p.native_mappings
        ],
        runner_file_sha256_now=p.runner_file_sha256_now,
        disagreements=[
            pb.FileDisagreement(
                path=d.path,
                sha256_in_process=d.sha256_in_process,
                sha256_agent=d.sha256_agent,
                reason=d.reason,
            )
            for d in p.disagreements
        ],
        provenance=None if p.provenance is None else _provenance_to_pb(p.provenance),
        drift=[pb.Drift(id=d.id, path=d.path, module=d.module, detail=d.detail) for d in p.drift],
        stack_witness=None if p.stack_witness is None else _witness_to_pb(p.stack_witness),
        runner_log=[
            pb.LogLine(level=x.level, logger=x.logger, message=x.message) for x in p.runner_log
        ],
        roles=list(p.roles),
    )


def _witness_to_pb(w: StackWitness) -> pb.StackWitness:
    return pb.StackWitness(
        samples=w.samples,
        runner_file_hits=w.runner_file_hits,
        runner_file=w.runner_file,
        top_files=w.top_files,
        error=w.error,
    )


def _witness_from_pb(msg: pb.StackWitness, at: str) -> StackWitness:
    samples = _count(msg.samples, f"{at}.samples")
    hits = _count(msg.runner_file_hits, f"{at}.runner_file_hits")
    if hits > samples:
        _fail(f"{at}.runner_file_hits", f"{hits} hits in {samples} samples")
    return StackWitness(
        samples=samples,
        runner_file_hits=hits,
        runner_file=msg.runner_file if msg.HasField("runner_file") else None,
        top_files=tuple(msg.top_files),
        error=msg.error if msg.HasField("error") else None,
    )


def _provenance_to_pb(v: Provenance) -> pb.Provenance:
    return pb.Provenance(
        counts=dict(v.counts),
        files=[
            pb.FileOrigin(
                path=f.path,
                origin=f.origin,
                reason=f.reason,
                distribution=f.distribution,
                version=f.version,
                record_path=f.record_path,
                sha256=f.sha256,
                expected_sha256=f.expected_sha256,
            )
            for f in v.files
        ],
        distributions=[
            pb.DistributionFiles(name=n, version=ver, files=k) for n, ver, k in v.distributions
        ],
    )


_ORIGINS = tuple(o.value for o in Origin)


def _provenance_from_pb(msg: pb.Provenance, at: str) -> Provenance:
    for origin, n in msg.counts.items():
        if origin not in _ORIGINS:
            _fail(f"{at}.counts", f"unknown provenance class {origin!r}")
        _count(n, f"{at}.counts[{origin}]")
    files = []
    for i, f in enumerate(msg.files):
        where = f"{at}.files[{i}]"
        if f.origin not in _ORIGINS:
            _fail(f"{where}.origin", f"must be one of {list(_ORIGINS)}, got {f.origin!r}")

        def opt(field: str, msg: pb.FileOrigin = f) -> str | None:
            return str(getattr(msg, field)) if msg.HasField(field) else None

        sha, expected = opt("sha256"), opt("expected_sha256")
        files.append(
            FileOrigin(
                path=_required(f.path, f"{where}.path"),
                origin=f.origin,
                reason=f.reason,
                distribution=opt("distribution"),
                version=opt("version"),
                record_path=opt("record_path"),
                sha256=None if sha is None else _sha256(sha, f"{where}.sha256"),
                expected_sha256=(
                    None if expected is None else _sha256(expected, f"{where}.expected_sha256")
                ),
            )
        )
    counts = tuple((o, int(msg.counts.get(o, 0))) for o in _ORIGINS)
    dists = tuple(
        (
            _required(d.name, f"{at}.distributions[{i}].name"),
            d.version,
            _count(d.files, f"{at}.distributions[{i}].files"),
        )
        for i, d in enumerate(msg.distributions)
    )
    return Provenance(counts=counts, files=tuple(files), distributions=dists)


def _drift_from_pb(msg: pb.Drift, at: str) -> Drift:
    if msg.id not in DRIFT_IDS:
        _fail(f"{at}.id", f"unknown drift id {msg.id!r}")
    return Drift(
        id=msg.id,
        path=_required(msg.path, f"{at}.path"),
        module=msg.module if msg.HasField("module") else None,
        detail=msg.detail,
    )


def _process_from_pb(msg: pb.ProcessReport, at: str) -> ProcessReport:
    if not msg.HasField("key"):
        _fail(f"{at}.key", "required, but absent")
    if msg.files and not msg.files_included:
        _fail(f"{at}.files", f"{len(msg.files)} entries sent with files_included false")
    digest = msg.manifest_digest if msg.HasField("manifest_digest") else None
    return ProcessReport(
        key=_key_from_pb(msg.key, f"{at}.key"),
        ns_pid=_count(msg.ns_pid, f"{at}.ns_pid"),
        ppid=_count(msg.ppid, f"{at}.ppid"),
        start_time=_time(msg.start_time, f"{at}.start_time"),
        role=_required(msg.role, f"{at}.role"),
        rank=_count(msg.rank, f"{at}.rank") if msg.HasField("rank") else None,
        container_id=msg.container_id if msg.HasField("container_id") else None,
        cmdline=tuple(msg.cmdline),
        exe=msg.exe,
        probe_present=msg.probe_present,
        probe_errors=tuple(msg.probe_errors),
        runner=_runner_from_pb(msg.runner, f"{at}.runner") if msg.HasField("runner") else None,
        steps=_steps_from_pb(msg.steps, f"{at}.steps") if msg.HasField("steps") else None,
        hooks=tuple(_hook_from_pb(h, f"{at}.hooks[{i}]") for i, h in enumerate(msg.hooks)),
        manifest_digest=None if digest is None else _digest(digest, f"{at}.manifest_digest"),
        files=(
            tuple(_file_from_pb(f, f"{at}.files[{i}]") for i, f in enumerate(msg.files))
            if msg.files_included
            else None
        ),
        native_mappings=tuple(
            _native_from_pb(n, f"{at}.native_mappings[{i}]")
            for i, n in enumerate(msg.native_mappings)
        ),
        runner_file_sha256_now=(
            _sha256(msg.runner_file_sha256_now, f"{at}.runner_file_sha256_now")
            if msg.HasField("runner_file_sha256_now")
            else None
        ),
        disagreements=tuple(
            _disagreement_from_pb(d, f"{at}.disagreements[{i}]")
            for i, d in enumerate(msg.disagreements)
        ),
        provenance=(
            _provenance_from_pb(msg.provenance, f"{at}.provenance")
            if msg.HasField("provenance")
            else None
        ),
        drift=tuple(_drift_from_pb(d, f"{at}.drift[{i}]") for i, d in enumerate(msg.drift)),
        stack_witness=(
            _witness_from_pb(msg.stack_witness, f"{at}.stack_witness")
            if msg.HasField("stack_witness")
            else None
        ),
        runner_log=tuple(LogLine(x.level, x.logger, x.message) for x in msg.runner_log),
        roles=_roles_from_pb(msg.roles, f"{at}.roles"),
    )


_MAX_ROLES = 16  # roles of one process (vLLM's layouts give at most three)


def _roles_from_pb(values: Iterable[str], at: str) -> tuple[str, ...]:
    roles = _texts(values, at)
    if len(roles) > _MAX_ROLES:
        _fail(at, f"more than {_MAX_ROLES} roles")
    for i, r in enumerate(roles):
        _text(r, f"{at}[{i}]")
    return tuple(sorted(set(roles)))


_NATIVE_STATES = frozenset({"same", "replaced", "deleted", "unreadable"})


def _native_from_pb(msg: pb.NativeMapping, at: str) -> NativeMapping:
    if msg.state not in _NATIVE_STATES:
        _fail(f"{at}.state", f"must be one of {sorted(_NATIVE_STATES)}, got {msg.state!r}")
    return NativeMapping(
        path=_required(msg.path, f"{at}.path"),
        sha256=_sha256(msg.sha256, f"{at}.sha256") if msg.HasField("sha256") else None,
        size=_count(msg.size, f"{at}.size", minimum=-1),
        state=msg.state,
        error=msg.error if msg.HasField("error") else None,
        device=msg.device,
        inode=_count(msg.inode, f"{at}.inode"),
    )


def _disagreement_from_pb(msg: pb.FileDisagreement, at: str) -> FileDisagreement:
    def sha(field: str) -> str | None:
        return _sha256(getattr(msg, field), f"{at}.{field}") if msg.HasField(field) else None

    return FileDisagreement(
        path=_required(msg.path, f"{at}.path"),
        sha256_in_process=sha("sha256_in_process"),
        sha256_agent=sha("sha256_agent"),
        reason=_required(msg.reason, f"{at}.reason"),
    )


_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")
_RUNTIMES = ("docker", "containerd", "cri-o", "podman", "unknown")
_MAX_TEXT = 4096  # any one name, label or reason
_MAX_LABELS = 512


def _text(value: str, at: str) -> str:
    if len(value) > _MAX_TEXT:
        _fail(at, f"longer than {_MAX_TEXT} characters")
    return value


def _container_to_pb(c: ContainerInfo) -> pb.ContainerInfo:
    return pb.ContainerInfo(
        id=c.id,
        runtime=c.runtime,
        source=c.source,
        pod_uid=c.pod_uid,
        name=c.name,
        image=c.image,
        image_id=c.image_id,
        image_digests=list(c.image_digests),
        labels=dict(c.labels),
        restart_count=c.restart_count,
        started_at=c.started_at,
        docker_error=c.docker_error,
    )


def _container_from_pb(msg: pb.ContainerInfo, at: str) -> ContainerInfo:
    if not _CONTAINER_ID.fullmatch(msg.id):
        _fail(f"{at}.id", f"not a container id (12 to 64 lowercase hex digits): {msg.id!r}")
    if msg.runtime not in _RUNTIMES:
        _fail(f"{at}.runtime", f"{msg.runtime!r} is not one of {', '.join(_RUNTIMES)}")
    if msg.source not in ("cgroup", "mountinfo"):
        _fail(f"{at}.source", f"{msg.source!r} is not cgroup or mountinfo")
    if len(msg.labels) > _MAX_LABELS:
        _fail(f"{at}.labels", f"more than {_MAX_LABELS} labels")

    def opt(name: str) -> str | None:
        return _text(getattr(msg, name), f"{at}.{name}") if msg.HasField(name) else None

    labels = tuple(
        sorted(
            (_text(k, f"{at}.labels"), _text(v, f"{at}.labels[{k}]")) for k, v in msg.labels.items()
        )
    )
    restarts = msg.restart_count if msg.HasField("restart_count") else None
    return ContainerInfo(
        id=msg.id,
        runtime=msg.runtime,
        source=msg.source,
        pod_uid=opt("pod_uid"),
        name=opt("name"),
        image=opt("image"),
        image_id=opt("image_id"),
        image_digests=tuple(
            _text(d, f"{at}.image_digests[{i}]") for i, d in enumerate(msg.image_digests)
        ),
        labels=labels,
        restart_count=None if restarts is None else _count(restarts, f"{at}.restart_count"),
        started_at=opt("started_at"),
        docker_error=opt("docker_error"),
    )


_MAX_SPANS = 100_000  # request bindings in one report (the agent sends at most BINDINGS_PER_REPORT)


def _span_to_pb(b: RequestSpan) -> pb.RequestSpan:
    return pb.RequestSpan(
        process=_key_to_pb(b.process), internal_id=b.internal_id, first_step=b.first_step,
        last_step=b.last_step, steps=b.steps, tokens=b.tokens, first_unix=b.first_unix,
        last_unix=b.last_unix, manifest_first=b.manifest_first, manifest_last=b.manifest_last,
        runner=b.runner, hooks=dict(b.hooks), finished=b.finished,
        spec=None if b.spec is None else _request_spec_to_pb(b.spec),
    )  # fmt: skip


def _request_spec_to_pb(s: RequestSpec) -> pb.RequestSpec:
    return pb.RequestSpec(
        drafts=s.drafts, draft_tokens=s.draft_tokens, accepted_tokens=s.accepted_tokens,
        accepted_per_position=s.accepted_per_position, emitted_tokens=s.emitted_tokens,
    )  # fmt: skip


_MAX_POSITIONS = 64  # accepted_per_position entries (the probe keeps 8)


def _request_spec_from_pb(msg: pb.RequestSpec, at: str) -> RequestSpec:
    if len(msg.accepted_per_position) > _MAX_POSITIONS:
        _fail(f"{at}.accepted_per_position", f"more than {_MAX_POSITIONS} positions")
    return RequestSpec(
        drafts=_count(msg.drafts, f"{at}.drafts"),
        draft_tokens=_count(msg.draft_tokens, f"{at}.draft_tokens"),
        accepted_tokens=_count(msg.accepted_tokens, f"{at}.accepted_tokens"),
        accepted_per_position=tuple(
            _count(v, f"{at}.accepted_per_position[{i}]")
            for i, v in enumerate(msg.accepted_per_position)
        ),
        emitted_tokens=_count(msg.emitted_tokens, f"{at}.emitted_tokens"),
    )


def _span_from_pb(msg: pb.RequestSpan, at: str) -> RequestSpan:
    first, last = (
        _count(msg.first_step, f"{at}.first_step"),
        _count(msg.last_step, f"{at}.last_step"),
    )
    if last < first:
        _fail(f"{at}.last_step", "before first_step")
    return RequestSpan(
        process=_key_from_pb(msg.process, f"{at}.process"),
        internal_id=_required(_text(msg.internal_id, f"{at}.internal_id"), f"{at}.internal_id"),
        first_step=first,
        last_step=last,
        steps=_count(msg.steps, f"{at}.steps"),
        tokens=_count(msg.tokens, f"{at}.tokens"),
        first_unix=_time(msg.first_unix, f"{at}.first_unix"),
        last_unix=_time(msg.last_unix, f"{at}.last_unix"),
        manifest_first=_text(msg.manifest_first, f"{at}.manifest_first"),
        manifest_last=_text(msg.manifest_last, f"{at}.manifest_last"),
        runner=_text(msg.runner, f"{at}.runner"),
        hooks=tuple(
            sorted(
                (_text(k, f"{at}.hooks"), _count(v, f"{at}.hooks[{k!r}]"))
                for k, v in msg.hooks.items()
            )
        ),
        finished=msg.finished,
        spec=_request_spec_from_pb(msg.spec, f"{at}.spec") if msg.HasField("spec") else None,
    )


def _request_id_to_pb(r: RequestId) -> pb.RequestId:
    return pb.RequestId(
        process=_key_to_pb(r.process), internal_id=r.internal_id, external_id=r.external_id,
        unix=r.unix,
    )  # fmt: skip


def _request_id_from_pb(msg: pb.RequestId, at: str) -> RequestId:
    return RequestId(
        process=_key_from_pb(msg.process, f"{at}.process"),
        internal_id=_required(_text(msg.internal_id, f"{at}.internal_id"), f"{at}.internal_id"),
        external_id=_required(_text(msg.external_id, f"{at}.external_id"), f"{at}.external_id"),
        unix=_time(msg.unix, f"{at}.unix"),
    )


def _bindings_from_pb(
    msg: pb.TargetReport, at: str
) -> tuple[tuple[RequestSpan, ...], tuple[RequestId, ...]]:
    if len(msg.spans) + len(msg.request_ids) > _MAX_SPANS:
        _fail(f"{at}.spans", f"more than {_MAX_SPANS} request bindings in one report")
    spans = tuple(_span_from_pb(b, f"{at}.spans[{i}]") for i, b in enumerate(msg.spans))
    ids = tuple(
        _request_id_from_pb(r, f"{at}.request_ids[{i}]") for i, r in enumerate(msg.request_ids)
    )
    return spans, ids


def report_to_pb(report: TargetReport) -> pb.TargetReport:
    return pb.TargetReport(
        agent_id=report.agent_id,
        target=report.target,
        seq=report.seq,
        nonce=report.nonce,
        sent_unix=report.sent_unix,
        processes=[_process_to_pb(p) for p in report.processes],
        gone=[_key_to_pb(k) for k in report.gone],
        collected_unix=report.collected_unix,
        containers=[_container_to_pb(c) for c in report.containers],
        unobservable=list(report.unobservable),
        spans=[_span_to_pb(b) for b in report.spans],
        request_ids=[_request_id_to_pb(r) for r in report.request_ids],
    )


def report_from_pb(msg: pb.TargetReport, at: str = "report") -> TargetReport:
    agent_id = _required(msg.agent_id, f"{at}.agent_id")
    target = _required(msg.target, f"{at}.target")
    seq = _count(msg.seq, f"{at}.seq")
    sent_unix = _time(msg.sent_unix, f"{at}.sent_unix")
    collected_unix = None
    if msg.HasField("collected_unix"):
        collected_unix = _time(msg.collected_unix, f"{at}.collected_unix")
        if collected_unix > sent_unix:
            _fail(
                f"{at}.collected_unix", "after sent_unix: a report cannot leave before it is read"
            )
    processes: list[ProcessReport] = []
    for i, p in enumerate(msg.processes):
        process = _process_from_pb(p, f"{at}.processes[{i}]")
        if any(process.key == seen.key for seen in processes):
            _fail(f"{at}.processes[{i}].key", f"duplicate process {process.key}")
        processes.append(process)
    spans, request_ids = _bindings_from_pb(msg, at)
    return TargetReport(
        agent_id=agent_id,
        target=target,
        seq=seq,
        nonce=msg.nonce,  # may be empty; the server checks it against the current nonce
        sent_unix=sent_unix,
        processes=tuple(processes),
        gone=tuple(_key_from_pb(k, f"{at}.gone[{i}]") for i, k in enumerate(msg.gone)),
        collected_unix=collected_unix,
        containers=_containers_from_pb(msg, at),
        unobservable=tuple(
            _required(_text(u, f"{at}.unobservable[{i}]"), f"{at}.unobservable[{i}]")
            for i, u in enumerate(msg.unobservable)
        ),
        spans=spans,
        request_ids=request_ids,
    )


def _containers_from_pb(msg: pb.TargetReport, at: str) -> tuple[ContainerInfo, ...]:
    out: dict[str, ContainerInfo] = {}
    for i, c in enumerate(msg.containers):
        info = _container_from_pb(c, f"{at}.containers[{i}]")
        if info.id in out:
            _fail(f"{at}.containers[{i}].id", f"container {info.id} listed twice")
        out[info.id] = info
    return tuple(out.values())


def report_to_bytes(report: TargetReport) -> bytes:
    """The report's wire bytes (what a store keeps); :func:`report_from_bytes` reads them back."""
    data: bytes = report_to_pb(report).SerializeToString(deterministic=True)
    return data


def report_from_bytes(data: bytes) -> TargetReport:
    msg = pb.TargetReport()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise WireError("report", f"not a TargetReport message: {e}") from e
    return report_from_pb(msg)


# Verdicts ------------------------------------------------------------------------------------


def finding_to_pb(finding: Finding) -> pb.Finding:
    try:
        context = json.dumps(dict(finding.context), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise WireError(f"finding {finding.id!r} context", f"not JSON: {e}") from e
    return pb.Finding(
        id=finding.id,
        severity=severity_to_pb(finding.severity),
        message=finding.message,
        target=finding.target,
        context_json=context if finding.context else "",
    )


def finding_from_pb(msg: pb.Finding, at: str = "finding") -> Finding:
    context: Any = {}
    if msg.context_json:
        try:
            context = json.loads(msg.context_json, parse_constant=_reject_constant)
        except ValueError as e:
            _fail(f"{at}.context_json", f"not JSON: {e}")
        if not isinstance(context, dict):
            _fail(f"{at}.context_json", f"not a JSON object: {msg.context_json[:80]!r}")
    return Finding(
        id=_required(msg.id, f"{at}.id"),
        severity=severity_from_pb(msg.severity, f"{at}.severity"),
        message=msg.message,
        target=msg.target,
        context=context,
    )


def _hook_count_to_pb(h: HookCount) -> pb.HookCount:
    return pb.HookCount(
        name=h.name,
        pid=h.pid,
        role=h.role,
        rank=h.rank,
        fired=h.fired,
        fired_productive=h.fired_productive,
        productive_steps=h.productive_steps,
        total_steps=h.total_steps,
        fired_decode=h.fired_decode,
        decode_steps=h.decode_steps,
        fired_prefill=h.fired_prefill,
        prefill_steps=h.prefill_steps,
        fired_outside=h.fired_outside,
        on=h.on,
        min_fires_per_step=h.min_fires_per_step,
    )


def _hook_count_from_pb(msg: pb.HookCount, at: str) -> HookCount:
    return HookCount(
        name=_required(msg.name, f"{at}.name"),
        pid=_count(msg.pid, f"{at}.pid", minimum=1),
        role=msg.role,
        rank=_count(msg.rank, f"{at}.rank") if msg.HasField("rank") else None,
        fired=_count(msg.fired, f"{at}.fired"),
        fired_productive=_count(msg.fired_productive, f"{at}.fired_productive"),
        productive_steps=_count(msg.productive_steps, f"{at}.productive_steps"),
        total_steps=_count(msg.total_steps, f"{at}.total_steps"),
        fired_decode=_count(msg.fired_decode, f"{at}.fired_decode"),
        decode_steps=_count(msg.decode_steps, f"{at}.decode_steps"),
        fired_prefill=_count(msg.fired_prefill, f"{at}.fired_prefill"),
        prefill_steps=_count(msg.prefill_steps, f"{at}.prefill_steps"),
        fired_outside=_count(msg.fired_outside, f"{at}.fired_outside"),
        on=msg.on or "productive",
        min_fires_per_step=_ratio(msg.min_fires_per_step, f"{at}.min_fires_per_step"),
    )


def target_verdict_to_pb(tv: TargetVerdict) -> pb.TargetVerdict:
    return pb.TargetVerdict(
        target=tv.target,
        verdict=verdict_to_pb(tv.verdict),
        findings=[finding_to_pb(f) for f in tv.findings],
        evaluated_unix=tv.evaluated_unix,
        report_unix=tv.report_unix,
        hooks=[_hook_count_to_pb(h) for h in tv.hooks],
    )


def target_verdict_from_pb(msg: pb.TargetVerdict, at: str = "target_verdict") -> TargetVerdict:
    received = msg.report_unix if msg.HasField("report_unix") else None
    return TargetVerdict(
        target=_required(msg.target, f"{at}.target"),
        verdict=verdict_from_pb(msg.verdict, f"{at}.verdict"),
        findings=tuple(
            finding_from_pb(f, f"{at}.findings[{i}]") for i, f in enumerate(msg.findings)
        ),
        evaluated_unix=_time(msg.evaluated_unix, f"{at}.evaluated_unix"),
        report_unix=None if received is None else _time(received, f"{at}.report_unix"),
        hooks=tuple(_hook_count_from_pb(h, f"{at}.hooks[{i}]") for i, h in enumerate(msg.hooks)),
    )


def run_verdict_to_pb(rv: RunVerdict) -> pb.RunVerdict:
    return pb.RunVerdict(
        run=rv.run,
        policy_digest=rv.policy_digest,
        verdict=verdict_to_pb(rv.verdict),
        targets=[target_verdict_to_pb(t) for t in rv.targets],
        findings=[finding_to_pb(f) for f in rv.findings],
        evaluated_unix=rv.evaluated_unix,
    )


def run_verdict_from_pb(msg: pb.RunVerdict, at: str = "run_verdict") -> RunVerdict:
    return RunVerdict(
        run=_required(msg.run, f"{at}.run"),
        policy_digest=_required(msg.policy_digest, f"{at}.policy_digest"),
        verdict=verdict_from_pb(msg.verdict, f"{at}.verdict"),
        targets=tuple(
            target_verdict_from_pb(t, f"{at}.targets[{i}]") for i, t in enumerate(msg.targets)
        ),
        findings=tuple(
            finding_from_pb(f, f"{at}.findings[{i}]") for i, f in enumerate(msg.findings)
        ),
        evaluated_unix=_time(msg.evaluated_unix, f"{at}.evaluated_unix"),
    )


# Requests and responses ----------------------------------------------------------------------


def hello_request_to_pb(hello: AgentHello) -> pb.HelloRequest:
    return pb.HelloRequest(agent_id=hello.agent_id, targets=hello.targets)


def hello_request_from_pb(msg: pb.HelloRequest) -> AgentHello:
    return AgentHello(
        agent_id=_required(msg.agent_id, "hello.agent_id"),
        targets=_texts(msg.targets, "hello.targets"),
    )


def hello_response_to_pb(reply: HelloReply) -> pb.HelloResponse:
    return pb.HelloResponse(
        nonce=reply.nonce, report_interval_s=reply.report_interval_s, last_seq=reply.last_seq
    )


def hello_response_from_pb(msg: pb.HelloResponse) -> HelloReply:
    interval = msg.report_interval_s
    if not (math.isfinite(interval) and interval > 0):
        _fail("hello_response.report_interval_s", f"must be a positive duration, got {interval}")
    return HelloReply(
        nonce=_required(msg.nonce, "hello_response.nonce"),
        report_interval_s=interval,
        last_seq=_count(msg.last_seq, "hello_response.last_seq"),
    )


def report_request_to_pb(report: TargetReport) -> pb.ReportRequest:
    return pb.ReportRequest(report=report_to_pb(report))


def report_request_from_pb(msg: pb.ReportRequest) -> TargetReport:
    if not msg.HasField("report"):
        _fail("report", "required, but absent")
    return report_from_pb(msg.report)


def report_response_to_pb(ack: ReportAck) -> pb.ReportResponse:
    return pb.ReportResponse(
        accepted=ack.accepted, seq=ack.seq, nonce=ack.nonce, need_manifests=ack.need_manifests
    )


def report_response_from_pb(msg: pb.ReportResponse) -> ReportAck:
    at = "report_response"
    return ReportAck(
        accepted=msg.accepted,
        seq=_count(msg.seq, f"{at}.seq"),
        nonce=_required(msg.nonce, f"{at}.nonce"),
        need_manifests=tuple(
            _digest(d, f"{at}.need_manifests[{i}]") for i, d in enumerate(msg.need_manifests)
        ),
    )


def register_run_request_to_pb(reg: RunRegistration) -> pb.RegisterRunRequest:
    return pb.RegisterRunRequest(name=reg.name, policy_toml=reg.policy_toml, source=reg.source)


def register_run_request_from_pb(msg: pb.RegisterRunRequest) -> RunRegistration:
    return RunRegistration(
        name=_required(msg.name, "register_run.name"),
        policy_toml=_required(msg.policy_toml, "register_run.policy_toml"),
        source=msg.source,
    )


def register_run_response_to_pb(run: RegisteredRun) -> pb.RegisterRunResponse:
    return pb.RegisterRunResponse(
        name=run.name, policy_digest=run.policy_digest, created_unix=run.created_unix
    )


def register_run_response_from_pb(msg: pb.RegisterRunResponse) -> RegisteredRun:
    at = "register_run_response"
    return RegisteredRun(
        name=_required(msg.name, f"{at}.name"),
        policy_digest=_required(msg.policy_digest, f"{at}.policy_digest"),
        created_unix=_time(msg.created_unix, f"{at}.created_unix"),
    )


def get_run_status_request_to_pb(name: str) -> pb.GetRunStatusRequest:
    return pb.GetRunStatusRequest(name=name)


def get_run_status_request_from_pb(msg: pb.GetRunStatusRequest) -> str:
    return _required(msg.name, "get_run_status.name")


def get_run_status_response_to_pb(verdict: RunVerdict) -> pb.GetRunStatusResponse:
    return pb.GetRunStatusResponse(verdict=run_verdict_to_pb(verdict))


def get_run_status_response_from_pb(msg: pb.GetRunStatusResponse) -> RunVerdict:
    if not msg.HasField("verdict"):
        _fail("get_run_status_response.verdict", "required, but absent")
    return run_verdict_from_pb(msg.verdict, "get_run_status_response.verdict")


def run_summary_to_pb(run: RunSummary) -> pb.RunSummary:
    return pb.RunSummary(
        name=run.name,
        policy_digest=run.policy_digest,
        created_unix=run.created_unix,
        verdict=verdict_to_pb(run.verdict),
    )


def run_summary_from_pb(msg: pb.RunSummary, at: str = "run_summary") -> RunSummary:
    return RunSummary(
        name=_required(msg.name, f"{at}.name"),
        policy_digest=_required(msg.policy_digest, f"{at}.policy_digest"),
        created_unix=_time(msg.created_unix, f"{at}.created_unix"),
        verdict=verdict_from_pb(msg.verdict, f"{at}.verdict"),
    )


def list_runs_response_to_pb(runs: Iterable[RunSummary]) -> pb.ListRunsResponse:
    return pb.ListRunsResponse(runs=[run_summary_to_pb(r) for r in runs])


def list_runs_response_from_pb(msg: pb.ListRunsResponse) -> tuple[RunSummary, ...]:
    return tuple(
        run_summary_from_pb(r, f"list_runs_response.runs[{i}]") for i, r in enumerate(msg.runs)
    )


def process_to_json(p: ProcessReport) -> dict[str, Any]:
    """A process report as JSON-ready data (protobuf's JSON mapping of ``ProcessReport``): the
    form ``verifier inspect --json`` stores, which ``process_from_json`` reads back."""
    data: dict[str, Any] = json_format.MessageToDict(
        _process_to_pb(p), preserving_proto_field_name=True
    )
    return data


def process_from_json(data: object, at: str = "report") -> ProcessReport:
    """Read back what ``process_to_json`` wrote; WireError names the field that is wrong."""
    if not isinstance(data, dict):
        _fail(at, f"must be a JSON object, not {type(data).__name__}")
    msg = pb.ProcessReport()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as e:
        raise WireError(at, f"not a ProcessReport: {e}") from e
    return _process_from_pb(msg, at)


def run_verdict_to_json(rv: RunVerdict) -> dict[str, Any]:
    """A run verdict as JSON-ready data (protobuf's JSON mapping), e.g. a window's start."""
    data: dict[str, Any] = json_format.MessageToDict(
        run_verdict_to_pb(rv), preserving_proto_field_name=True
    )
    return data


def run_verdict_from_json(data: object, at: str = "run_verdict") -> RunVerdict:
    if not isinstance(data, dict):
        _fail(at, f"must be a JSON object, not {type(data).__name__}")
    msg = pb.RunVerdict()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as e:
        raise WireError(at, f"not a RunVerdict: {e}") from e
    return run_verdict_from_pb(msg, at)
