"""``TargetReport``, one agent's snapshot of one target: its processes (``process.py``),
the containers they run in, and the request bindings that came with it; and the bytes a
store or spool keeps of it."""

from __future__ import annotations

import re

from google.protobuf.message import DecodeError, Message

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import (
    ContainerInfo,
    ProcessKey,
    ProcessReport,
    RequestId,
    RequestSpan,
    RequestSpec,
    TargetReport,
)
from servewitness.wire import fields as F
from servewitness.wire import limits as L
from servewitness.wire.fields import WireError
from servewitness.wire.process import key_from_pb, key_to_pb, process_from_pb, process_to_pb

_CONTAINER_ID = re.compile(r"[0-9a-f]{12,64}")


_RUNTIMES = ("docker", "containerd", "cri-o", "podman", "unknown")


_MAX_LABELS = 512


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
        F.fail(f"{at}.id", f"not a container id (12 to 64 lowercase hex digits): {msg.id!r}")
    if msg.runtime not in _RUNTIMES:
        F.fail(f"{at}.runtime", f"{msg.runtime!r} is not one of {', '.join(_RUNTIMES)}")
    if msg.source not in ("cgroup", "mountinfo"):
        F.fail(f"{at}.source", f"{msg.source!r} is not cgroup or mountinfo")
    if len(msg.labels) > _MAX_LABELS:
        F.fail(f"{at}.labels", f"more than {_MAX_LABELS} labels")

    def opt(name: str) -> str | None:
        return F.text(getattr(msg, name), f"{at}.{name}") if msg.HasField(name) else None

    labels = tuple(
        sorted(
            (F.text(k, f"{at}.labels"), F.text(v, f"{at}.labels[{k}]"))
            for k, v in msg.labels.items()
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
            F.text(d, f"{at}.image_digests[{i}]") for i, d in enumerate(msg.image_digests)
        ),
        labels=labels,
        restart_count=None if restarts is None else F.count(restarts, f"{at}.restart_count"),
        started_at=opt("started_at"),
        docker_error=opt("docker_error"),
    )


def _span_to_pb(b: RequestSpan) -> pb.RequestSpan:
    return pb.RequestSpan(
        process=key_to_pb(b.process), internal_id=b.internal_id, first_step=b.first_step,
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
        F.fail(f"{at}.accepted_per_position", f"more than {_MAX_POSITIONS} positions")
    return RequestSpec(
        drafts=F.count(msg.drafts, f"{at}.drafts"),
        draft_tokens=F.count(msg.draft_tokens, f"{at}.draft_tokens"),
        accepted_tokens=F.count(msg.accepted_tokens, f"{at}.accepted_tokens"),
        accepted_per_position=tuple(
            F.count(v, f"{at}.accepted_per_position[{i}]")
            for i, v in enumerate(msg.accepted_per_position)
        ),
        emitted_tokens=F.count(msg.emitted_tokens, f"{at}.emitted_tokens"),
    )


def span_checked(msg: pb.RequestSpan, at: str) -> RequestSpan:
    """A request span through every check, each naming its field under AT (the slow path)."""
    first, last = (
        F.count(msg.first_step, f"{at}.first_step"),
        F.count(msg.last_step, f"{at}.last_step"),
    )
    if last < first:
        F.fail(f"{at}.last_step", "before first_step")
    return RequestSpan(
        process=key_from_pb(msg.process, f"{at}.process"),
        internal_id=F.required(F.text(msg.internal_id, f"{at}.internal_id"), f"{at}.internal_id"),
        first_step=first,
        last_step=last,
        steps=F.count(msg.steps, f"{at}.steps"),
        tokens=F.count(msg.tokens, f"{at}.tokens"),
        first_unix=F.finite_time(msg.first_unix, f"{at}.first_unix"),
        last_unix=F.finite_time(msg.last_unix, f"{at}.last_unix"),
        manifest_first=F.text(msg.manifest_first, f"{at}.manifest_first"),
        manifest_last=F.text(msg.manifest_last, f"{at}.manifest_last"),
        runner=F.text(msg.runner, f"{at}.runner"),
        hooks=_span_hooks(msg, at),
        finished=msg.finished,
        spec=_request_spec_from_pb(msg.spec, f"{at}.spec") if msg.HasField("spec") else None,
    )


def _span_hooks(msg: pb.RequestSpan, at: str) -> tuple[tuple[str, int], ...]:
    L.at_most(L.HOOKS_PER_PROCESS, len(msg.hooks), f"{at}.hooks")
    return tuple(
        sorted(
            (F.text(k, f"{at}.hooks"), F.count(v, f"{at}.hooks[{k!r}]"))
            for k, v in msg.hooks.items()
        )
    )


def _request_id_to_pb(r: RequestId) -> pb.RequestId:
    return pb.RequestId(
        process=key_to_pb(r.process), internal_id=r.internal_id, external_id=r.external_id,
        unix=r.unix,
    )  # fmt: skip


def request_id_checked(msg: pb.RequestId, at: str) -> RequestId:
    """A request id through every check, each naming its field under AT (the slow path)."""
    return RequestId(
        process=key_from_pb(msg.process, f"{at}.process"),
        internal_id=F.required(F.text(msg.internal_id, f"{at}.internal_id"), f"{at}.internal_id"),
        external_id=F.required(F.text(msg.external_id, f"{at}.external_id"), f"{at}.external_id"),
        unix=F.finite_time(msg.unix, f"{at}.unix"),
    )


def check_bindings(msg: pb.TargetReport, at: str = "report") -> None:
    """MSG's request bindings within their limit, before any is converted."""
    L.at_most(L.BINDINGS_PER_REPORT, len(msg.spans) + len(msg.request_ids), f"{at}.spans")


def span_from_pb(msg: pb.RequestSpan, at: str) -> RequestSpan:
    """A request span, checked: the fast path (``span_fields``) if it takes it, else every
    check with its field's path (a WireError names it)."""
    f = span_fields(msg)
    if f is None:
        return span_checked(msg, at)
    return RequestSpan(ProcessKey(f[0], f[1], f[2]), *f[3:], None)


def request_id_from_pb(msg: pb.RequestId, at: str) -> RequestId:
    """A request id, checked (as ``span_from_pb``)."""
    f = request_id_fields(msg)
    if f is None:
        return request_id_checked(msg, at)
    return RequestId(ProcessKey(f[0], f[1], f[2]), f[3], f[4], f[5])


def _bindings_from_pb(
    msg: pb.TargetReport, at: str
) -> tuple[tuple[RequestSpan, ...], tuple[RequestId, ...]]:
    check_bindings(msg, at)
    spans = tuple(span_from_pb(b, f"{at}.spans[{i}]") for i, b in enumerate(msg.spans))
    ids = tuple(
        request_id_from_pb(r, f"{at}.request_ids[{i}]") for i, r in enumerate(msg.request_ids)
    )
    return spans, ids


# The fast path of a report's bindings (hundreds per report, every report): the same checks as
# span_checked and request_id_checked without building a field path per field; None when any
# check fails (or a spec is present), and the caller then converts with the checked path, which
# names the field (or, under ``relaxed``, accepts a time over ``unix_time``). Measured: building
# the paths was ~15 % of the verifier's GIL time at 500 agents (BENCHMARKS.md).
_MAX_TEXT = F.MAX_TEXT
_MAX_UNIX = F.MAX_UNIX_TIME


def _time_ok(value: float) -> bool:
    return 0 <= value <= _MAX_UNIX  # False for NaN; inf is above the limit


# A span's fields as the fast path checked them, in RequestSpan's order with its process key
# flattened: boot_id, pid, start_ticks, internal_id, first_step, last_step, steps, tokens,
# first_unix, last_unix, manifest_first, manifest_last, runner, hooks (sorted pairs), finished.
SpanFields = tuple[
    str, int, int, str, int, int, int, int, float, float, str, str, str,
    tuple[tuple[str, int], ...], bool,
]  # fmt: skip
# A request id's: boot_id, pid, start_ticks, internal_id, external_id, unix.
RequestIdFields = tuple[str, int, int, str, str, float]


def span_fields(msg: pb.RequestSpan) -> SpanFields | None:
    """MSG's fields (``SpanFields``) if every check ``span_checked`` makes passes, else None
    (and for a span with speculation counts, which only the checked path converts): the
    caller then converts with the checked path, which names the failing field (or, under
    ``relaxed``, accepts a time over ``unix_time``). What a store needs of a span is made from
    these without building its objects (``server.binding_rows.tails_from_pb``)."""
    first, last, steps, tokens = msg.first_step, msg.last_step, msg.steps, msg.tokens
    t0, t1, internal = msg.first_unix, msg.last_unix, msg.internal_id
    m0, m1, runner, hooks = msg.manifest_first, msg.manifest_last, msg.runner, msg.hooks
    if (
        first < 0
        or last < first
        or steps < 0
        or tokens < 0
        or not 0 < len(internal) <= _MAX_TEXT
        or not (_time_ok(t0) and _time_ok(t1))
        or len(m0) > _MAX_TEXT
        or len(m1) > _MAX_TEXT
        or len(runner) > _MAX_TEXT
        or msg.HasField("spec")
    ):
        return None
    if hooks:
        if len(hooks) > L.HOOKS_PER_PROCESS.value:
            return None
        pairs = sorted(hooks.items())
        if any(len(k) > _MAX_TEXT or v < 0 for k, v in pairs):
            return None
        hook_pairs: tuple[tuple[str, int], ...] = tuple(pairs)
    else:
        hook_pairs = ()
    key = msg.process
    pid, ticks = key.pid, key.start_ticks
    if pid < 1 or ticks < 0:
        return None
    return (
        key.boot_id, pid, ticks, internal, first, last, steps, tokens, t0, t1, m0, m1, runner,
        hook_pairs, msg.finished,
    )  # fmt: skip


def request_id_fields(msg: pb.RequestId) -> RequestIdFields | None:
    """MSG's fields (``RequestIdFields``) if every check ``request_id_checked`` makes passes,
    else None (as ``span_fields``)."""
    internal, external, unix = msg.internal_id, msg.external_id, msg.unix
    if not (0 < len(internal) <= _MAX_TEXT and 0 < len(external) <= _MAX_TEXT and _time_ok(unix)):
        return None
    key = msg.process
    pid, ticks = key.pid, key.start_ticks
    if pid < 1 or ticks < 0:
        return None
    return key.boot_id, pid, ticks, internal, external, unix


def report_to_pb(report: TargetReport) -> pb.TargetReport:
    return pb.TargetReport(
        agent_id=report.agent_id,
        target=report.target,
        seq=report.seq,
        nonce=report.nonce,
        sent_unix=report.sent_unix,
        processes=[process_to_pb(p) for p in report.processes],
        gone=[key_to_pb(k) for k in report.gone],
        collected_unix=report.collected_unix,
        containers=[_container_to_pb(c) for c in report.containers],
        unobservable=list(report.unobservable),
        spans=[_span_to_pb(b) for b in report.spans],
        request_ids=[_request_id_to_pb(r) for r in report.request_ids],
        mixed_roots=[key_to_pb(k) for k in report.mixed_roots],
        evidence_age_s=report.evidence_age_s,
        evidence_age_unknown=report.evidence_age_unknown,
        nonce_held_s=report.nonce_held_s,
    )


def check_sizes(msg: pb.TargetReport, at: str) -> None:
    """Every count a report claims within its limit, before any entry is converted: the cost
    of what follows is then bounded, whoever sent it."""
    L.at_most(L.PROCESSES_PER_REPORT, len(msg.processes), f"{at}.processes")
    for name in ("gone", "mixed_roots", "unobservable"):
        L.at_most(L.KEYS_PER_REPORT, len(getattr(msg, name)), f"{at}.{name}")
    L.at_most(L.CONTAINERS_PER_REPORT, len(msg.containers), f"{at}.containers")
    files = sum(len(p.files) for p in msg.processes)
    L.at_most(L.FILES_PER_REPORT, files, f"{at}.processes[*].files")
    L.at_most(L.REPORT_SEQ, msg.seq, f"{at}.seq")
    size = msg.ByteSize()
    # An entry takes at least two bytes (a tag and a length): below this, there cannot be
    # more entries than entries_per_report, nor more than held_report_bytes.
    if size <= 2 * L.ENTRIES_PER_REPORT.value:
        return
    size -= sum(_entry_bytes(f, 2) for p in msg.processes for f in p.files)  # field 17
    size -= sum(_entry_bytes(b, 1) for b in msg.spans)  # field 11
    size -= sum(_entry_bytes(r, 1) for r in msg.request_ids)  # field 12
    L.at_most(L.HELD_REPORT_BYTES, size, f"{at} without files and bindings")
    if size > 2 * L.ENTRIES_PER_REPORT.value:
        entries = sum(_entries(p, skip="files") for p in msg.processes)
        L.at_most(L.ENTRIES_PER_REPORT, entries, f"{at}.processes[*] (repeated entries)")


def _entries(msg: Message, skip: str = "") -> int:
    """Entries of MSG's repeated fields, at any depth (field SKIP of MSG itself left out)."""
    n = 0
    for fd, value in msg.ListFields():
        if fd.name == skip:
            continue
        if fd.is_repeated:
            n += len(value)
            if fd.message_type is not None and not fd.message_type.GetOptions().map_entry:
                n += sum(_entries(v) for v in value)
        elif fd.message_type is not None:
            n += _entries(value)
    return n


def _entry_bytes(entry: Message, tag_bytes: int) -> int:
    """What ENTRY takes in its repeated field: its tag, its length (a varint), its bytes. (A
    process's own length may take a byte or two fewer without its files: counted as held.)"""
    n = entry.ByteSize()
    return tag_bytes + max(1, (n.bit_length() + 6) // 7) + n


def report_from_pb(
    msg: pb.TargetReport, at: str = "report", *, bindings: bool = True
) -> TargetReport:
    """MSG converted, every field checked. BINDINGS False: its request bindings are left out
    (``spans`` and ``request_ids`` empty) for a caller that converts them to the store's rows
    itself (``server.binding_rows.tails_from_pb``), after everything else here is checked."""
    agent_id = L.ident(F.required(msg.agent_id, f"{at}.agent_id"), f"{at}.agent_id")
    target = L.ident(F.required(msg.target, f"{at}.target"), f"{at}.target")
    L.ident(msg.nonce, f"{at}.nonce")
    check_sizes(msg, at)
    seq = F.count(msg.seq, f"{at}.seq")
    sent_unix = F.finite_time(msg.sent_unix, f"{at}.sent_unix")
    collected_unix = None
    if msg.HasField("collected_unix"):
        collected_unix = F.finite_time(msg.collected_unix, f"{at}.collected_unix")
        if collected_unix > sent_unix:
            F.fail(
                f"{at}.collected_unix", "after sent_unix: a report cannot leave before it is read"
            )
    age_s = None
    if msg.HasField("evidence_age_s"):
        age_s = F.finite_time(msg.evidence_age_s, f"{at}.evidence_age_s")  # a span, >= 0
        if msg.evidence_age_unknown:
            F.fail(f"{at}.evidence_age_unknown", "set beside evidence_age_s: is the age known?")
    held_s = None
    if msg.HasField("nonce_held_s"):
        held_s = F.finite_time(msg.nonce_held_s, f"{at}.nonce_held_s")  # a span, >= 0
    processes: list[ProcessReport] = []
    keys: set[ProcessKey] = set()  # a set: the check stays linear in the processes
    for i, p in enumerate(msg.processes):
        process = process_from_pb(p, f"{at}.processes[{i}]")
        if process.key in keys:
            F.fail(f"{at}.processes[{i}].key", f"duplicate process {process.key}")
        keys.add(process.key)
        processes.append(process)
    spans, request_ids = _bindings_from_pb(msg, at) if bindings else ((), ())
    return TargetReport(
        agent_id=agent_id,
        target=target,
        seq=seq,
        nonce=msg.nonce,  # may be empty; the server checks it against the current nonce
        sent_unix=sent_unix,
        processes=tuple(processes),
        gone=tuple(key_from_pb(k, f"{at}.gone[{i}]") for i, k in enumerate(msg.gone)),
        collected_unix=collected_unix,
        containers=_containers_from_pb(msg, at),
        unobservable=tuple(
            F.required(F.text(u, f"{at}.unobservable[{i}]"), f"{at}.unobservable[{i}]")
            for i, u in enumerate(msg.unobservable)
        ),
        spans=spans,
        request_ids=request_ids,
        mixed_roots=tuple(
            key_from_pb(k, f"{at}.mixed_roots[{i}]") for i, k in enumerate(msg.mixed_roots)
        ),
        evidence_age_s=age_s,
        evidence_age_unknown=msg.evidence_age_unknown,
        nonce_held_s=held_s,
        collected_at=None,  # the agent's own clock reading: never on the wire
    )


def _containers_from_pb(msg: pb.TargetReport, at: str) -> tuple[ContainerInfo, ...]:
    out: dict[str, ContainerInfo] = {}
    for i, c in enumerate(msg.containers):
        info = _container_from_pb(c, f"{at}.containers[{i}]")
        if info.id in out:
            F.fail(f"{at}.containers[{i}].id", f"container {info.id} listed twice")
        out[info.id] = info
    return tuple(out.values())


def report_to_bytes(report: TargetReport) -> bytes:
    """The report's wire bytes (what a store keeps); :func:`report_from_bytes` reads them back."""
    data: bytes = report_to_pb(report).SerializeToString(deterministic=True)
    return data


def stored_bytes(msg: pb.TargetReport) -> bytes:
    """What a store keeps of MSG, a report ``report_from_pb`` accepted: MSG without its
    processes' files (stored once per manifest) and its bindings (rows of their own), unknown
    fields dropped. :func:`report_from_bytes` reads it back as that conversion with every
    ``files`` None and no bindings, exactly as :func:`report_to_bytes` of that stripped report
    would (``tests/test_stored_bytes.py``). Cut from the message as it arrived rather than
    encoded again from the conversion: a quarter of the CPU per report (BENCHMARKS.md). A
    report that carries a manifest's files is copied field by field, its files left out, so
    that a 200,000-file manifest is never held twice."""
    out = pb.TargetReport()
    if any(p.files for p in msg.processes):
        _copy_except(msg, out, _NOT_STORED | {"processes"})
        for p in msg.processes:
            _copy_except(p, out.processes.add(), frozenset({"files"}))
    else:
        out.CopyFrom(msg)
        for name in _NOT_STORED:
            out.ClearField(name)
    for q in out.processes:
        q.files_included = False
    out.DiscardUnknownFields()
    data: bytes = out.SerializeToString(deterministic=True)
    return data


_NOT_STORED = frozenset({"spans", "request_ids"})


def _copy_except(src: Message, dst: Message, skip: frozenset[str]) -> None:
    """SRC's set fields but SKIP into DST (empty); unknown fields are not copied."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        if fd.is_repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def report_from_bytes(data: bytes) -> TargetReport:
    msg = pb.TargetReport()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise WireError("report", f"not a TargetReport message: {e}") from e
    with L.relaxed():  # stored bytes: checked when they arrived, under that day's limits
        return report_from_pb(msg)
