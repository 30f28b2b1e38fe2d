"""Read a probe's state directory (journal + shared counters) without its cooperation.

The evidence it reads is returned as ``verifier.model`` types (steps, hooks, files, the live
runner, speculation, vLLM's log lines): the same values the agent reports. ``ProbeState``
adds what only the journal holds (the probe's mode, roles, errors, the interpreter's layout,
the raw graph record, the runner's worker and step-method files), for ``verifier inspect``.
Given the process the directory must belong to (``binding.Holder``), only files that process
holds are read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifier.evidence.binding import FileId, Holder, symlink
from verifier.evidence.counters import read_settled, steps_of
from verifier.model import (
    FileEntry,
    HookEvidence,
    LogLine,
    RunnerEvidence,
    SpecEvidence,
    StepEvidence,
    merkle_root,
)
from verifier.probe import layout as L

ROLE_RANK = {"worker": 3, "engine_core": 2, "api_server": 1}


@dataclass(frozen=True)
class ProbeState:
    """Everything one probe has recorded about its process."""

    directory: str
    pid: int
    start_ticks: int
    mode: str
    shared: bool
    roles: list[dict[str, Any]]
    runner: RunnerEvidence | None
    steps: StepEvidence  # with the graph mode and speculation the runner was recorded with
    hooks: tuple[HookEvidence, ...]
    files: tuple[FileEntry, ...]
    errors: list[dict[str, Any]]
    error_count: int
    manifest_digest: str
    extra: dict[str, Any] = field(default_factory=dict)
    # The interpreter's layout as the probe last recorded it: stdlib, prefix, base_prefix,
    # path (sys.path), cwd, version. Empty until the sweeper's first pass.
    interp: dict[str, Any] = field(default_factory=dict)
    # Modules that claim a file (__file__ or spec.origin) where there is none: module, claimed.
    fileless: tuple[tuple[str, str], ...] = ()
    # The compile / graph mode the runner ran in, as journaled (enforce_eager,
    # compilation_mode, cudagraph_mode, device); ``steps`` carries the typed fields.
    graph: dict[str, Any] = field(default_factory=dict)
    # The live runner's worker class and, per step method, the class and file defining it
    # (None: no runner recorded).
    runner_worker: str | None = None
    runner_methods: dict[str, Any] = field(default_factory=dict)
    # When the probe hashed each file (the process's wall clock), by path, where recorded.
    hashed_at: dict[str, float] = field(default_factory=dict)
    # vLLM's log lines about the model runner (why it chose the one it did), in order.
    runner_log: tuple[LogLine, ...] = ()
    # The first execute_model errors (the probe journals a few; steps.raised counts all):
    # step (the number it would have had), error ("RuntimeError: ...").
    step_errors: tuple[tuple[int, str], ...] = ()
    # Read bound to its process (``binding``): the (device, inode) of the bindings.jsonl the
    # process holds (empty: none yet), the only one a reader may take for its own. None: the
    # directory was read without a process to bind it to.
    bindings_file: frozenset[tuple[int, int]] | None = None
    journal_file: tuple[int, int] | None = None  # likewise: the journal's (device, inode)

    @property
    def role(self) -> tuple[str | None, int | None]:
        """Most specific role recorded (worker > engine_core > api_server) and its rank."""
        if not self.roles:
            return None, None
        best = max(self.roles, key=lambda r: ROLE_RANK.get(str(r.get("role")), 0))
        rank = best.get("rank")
        return str(best.get("role")), rank if isinstance(rank, int) else None


# A \uD800-\uDFFF escape, which may decode to a lone surrogate: a file name's undecodable bytes
# (Python's surrogateescape) or a hostile string, valid JSON either way.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _valid_unicode(v: Any) -> Any:
    """V with every string that is not valid Unicode escaped (a lone surrogate becomes the
    six characters ``\udcff``): what the wire (protobuf strings are UTF-8) can carry, and
    still distinct from any other string."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
        return v
    if isinstance(v, list):
        return [_valid_unicode(x) for x in v]
    if isinstance(v, dict):
        return {_valid_unicode(k): _valid_unicode(x) for k, x in v.items()}
    return v


def load_record(line: bytes) -> Any:
    """One JSON line written by the probed process (``json.loads``; raises ValueError or
    RecursionError as it does). Strings that are not valid Unicode come back escaped (see
    ``_valid_unicode``), so whatever a journal says can be reported."""
    rec = json.loads(line)
    return _valid_unicode(rec) if _SURROGATE_ESCAPE.search(line) else rec


def _parse(lines: list[bytes]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = load_record(line)
        except (ValueError, RecursionError):  # garbled, not UTF-8, or nested too deep
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def read_journal(path: Path) -> list[dict[str, Any]]:
    """Complete JSON records of a journal; a partial or garbled line is skipped."""
    got = _read_file(path)
    return _parse(got[0].split(b"\n")) if got is not None else []


def _read_file(path: Path) -> tuple[bytes, FileId] | None:
    """PATH's bytes and (device, inode), read from one descriptor; None when it cannot be
    opened (missing, or a symbolic link: a probe writes regular files only)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), (st.st_dev, st.st_ino)
    except OSError:
        return None
    finally:
        os.close(fd)


@dataclass
class _Cached:
    dev: int
    ino: int
    offset: int  # bytes of complete lines consumed
    prefix_sha256: bytes  # of those bytes: the cache is used only while they are unchanged
    records: list[dict[str, Any]]
    files: tuple[FileEntry, ...]
    hashed_at: dict[str, float]
    digest: str


class JournalCache:
    """Parses each journal once and then only what was appended. The journal is append-only:
    a different inode, a shorter file, or any change to the bytes already parsed (checked by
    their sha256 on every read, about a millisecond for a worker's journal) means it is parsed
    again from the start. Files and the manifest digest are recomputed only when new file
    records arrived. For a reader that looks at the same processes again and again (the agent)."""

    def __init__(self) -> None:
        self._entries: dict[str, _Cached] = {}

    def records(self, path: Path) -> _Cached | None:
        got = _read_file(path)
        if got is None:
            self._entries.pop(str(path), None)
            return None
        raw, (dev, ino) = got
        entry = self._entries.get(str(path))
        if (
            entry is None
            or (entry.dev, entry.ino) != (dev, ino)
            or len(raw) < entry.offset
            # An edit in place of what was already parsed (a tampered record) is seen too.
            or hashlib.sha256(raw[: entry.offset]).digest() != entry.prefix_sha256
        ):
            entry = _Cached(dev, ino, 0, hashlib.sha256(b"").digest(), [], (), {}, merkle_root([]))
        new = raw[entry.offset :]
        complete = new[: new.rfind(b"\n") + 1]
        entry.offset += len(complete)
        entry.prefix_sha256 = hashlib.sha256(raw[: entry.offset]).digest()
        fresh = _parse(complete.split(b"\n"))
        entry.records.extend(fresh)
        if any(r.get("k") == "file" for r in fresh):
            entry.files, entry.hashed_at = _files(entry.records)
            entry.digest = _digest(entry.files)
        self._entries[str(path)] = entry
        return entry

    def forget_missing(self, alive: set[str]) -> None:
        for key in [k for k in self._entries if k not in alive]:
            del self._entries[key]


def _opt_count(v: object) -> int | None:
    """V when it is a count (a non-negative int, not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: object) -> int:
    """An integer field of a record written by the probed process (anything else: 0)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _hook_record(h: dict[str, Any], k: object, rec: dict[str, Any]) -> None:
    """Fold one journal record about a declared hook into what is known of it (H)."""
    if k == "hook_loaded":
        h["loaded"] = True
    elif k == "hook_wrapped":
        h["owner"], h["how"] = rec.get("owner"), rec.get("how")
    elif k == "hook_unresolved":
        h["unresolved"] = rec.get("msg")
    elif k == "hook_instantiated":
        h.setdefault("instantiated", rec.get("class"))
    elif k == "device_counter":
        h["device"] = str(rec.get("device"))
    elif k == "device_base":
        value, step = _opt_count(rec.get("value")), _opt_count(rec.get("step"))
        if value is not None and step is not None:
            h["device_base"], h["device_base_step"] = value, step


def _hooks(records: list[dict[str, Any]], slots: list[int]) -> tuple[HookEvidence, ...]:
    by_name: dict[str, dict[str, Any]] = {}
    for rec in records:
        k, name = rec.get("k"), rec.get("name")
        if not isinstance(name, str):
            continue
        if k == "hook":
            by_name.setdefault(
                name, {"target": rec.get("target", ""), "source": rec.get("source", "")}
            )
            by_name[name]["slot"] = rec.get("slot")
        elif name in by_name:
            _hook_record(by_name[name], k, rec)
    out = []
    for name, h in by_name.items():
        slot = h.get("slot")
        fired = first = last = productive = prefill = decode = outside = device = 0
        if isinstance(slot, int) and slot >= 0 and slot + L.HOOK_STRIDE <= len(slots):
            device = slots[slot + L.HK_DEVICE]
            fired = slots[slot + L.HK_FIRES]
            first, last = slots[slot + L.HK_FIRST_STEP], slots[slot + L.HK_LAST_STEP]
            productive = slots[slot + L.HK_FIRES_PRODUCTIVE]
            prefill = slots[slot + L.HK_FIRES_PREFILL]
            decode = slots[slot + L.HK_FIRES_DECODE]
            outside = slots[slot + L.HK_FIRES_OUTSIDE]
        out.append(
            HookEvidence(
                name=name,
                target=str(h.get("target") or ""),
                source=str(h.get("source") or ""),
                module_loaded=bool(h.get("loaded")) or h.get("source") == "api",
                wrapped=isinstance(h.get("how"), str),
                owner=_opt_str(h.get("owner")),
                how=_opt_str(h.get("how")),
                unresolved=_opt_str(h.get("unresolved")),
                instantiated_class=_opt_str(h.get("instantiated")),
                fired=fired,
                fired_productive=productive,
                first_step=first if fired else None,
                last_step=last if fired else None,
                fired_prefill=prefill,
                fired_decode=decode,
                fired_outside=outside,
                device_fired=device if "device" in h else None,
                device=_opt_str(h.get("device")),
                device_base=_opt_count(h.get("device_base")) if "device" in h else None,
                device_base_step=_opt_count(h.get("device_base_step")) if "device" in h else None,
            )
        )
    return tuple(out)


def _files(records: list[dict[str, Any]]) -> tuple[tuple[FileEntry, ...], dict[str, float]]:
    """The manifest a journal's file records describe (the latest record of each path), and
    when the probe hashed each file (the process's wall clock; where the record says)."""
    latest: dict[str, FileEntry] = {}
    hashed_at: dict[str, float] = {}
    for rec in records:
        if rec.get("k") != "file" or not isinstance(rec.get("path"), str):
            continue
        t = rec.get("t")
        if isinstance(t, (int, float)):
            hashed_at[rec["path"]] = t
        else:
            hashed_at.pop(rec["path"], None)
        sha = rec.get("sha256")
        size = rec.get("size")
        latest[rec["path"]] = FileEntry(
            path=rec["path"],
            sha256=sha if isinstance(sha, str) else None,
            size=size if isinstance(size, int) else -1,
            kind=str(rec.get("kind", "")),
            module=rec.get("module") if isinstance(rec.get("module"), str) else None,
            at=str(rec.get("at", "")),
        )
    return tuple(sorted(latest.values(), key=lambda f: f.path)), hashed_at


def _digest(files: tuple[FileEntry, ...]) -> str:
    return merkle_root((f.path, f.sha256) for f in files if f.sha256)


def manifest_digest_at(records: list[dict[str, Any]], files: int) -> str:
    """The manifest digest of a journal's first FILES file records (what was loaded when a
    step that saw FILES of them ran)."""
    picked: list[dict[str, Any]] = []
    for rec in records:
        if len(picked) >= files:
            break
        if rec.get("k") == "file":
            picked.append(rec)
    return _digest(_files(picked)[0])


def _speculation(records: list[dict[str, Any]], slots: list[int]) -> SpecEvidence | None:
    rec = next((r for r in reversed(records) if r.get("k") == "spec"), None)
    if rec is None:
        return None
    on = rec.get("on")
    k = _opt_count(rec.get("num_speculative_tokens"))
    positions = min(k if k is not None else L.SPEC_POSITIONS, L.SPEC_POSITIONS)
    return SpecEvidence(
        on=on if isinstance(on, bool) else None,
        method=_opt_str(rec.get("method")),
        num_speculative_tokens=k,
        steps=slots[L.S_SPEC_STEPS],
        drafts=slots[L.S_SPEC_DRAFTS],
        draft_tokens=slots[L.S_SPEC_DRAFT_TOKENS],
        accepted_tokens=slots[L.S_SPEC_ACCEPTED],
        emitted_tokens=slots[L.S_SPEC_EMITTED],
        unread_steps=slots[L.S_SPEC_UNREAD],
        accepted_per_position=tuple(
            slots[L.S_SPEC_POS_BASE + i] for i in range(positions if on is True else 0)
        ),
    )


def _log_lines(records: list[dict[str, Any]]) -> tuple[LogLine, ...]:
    return tuple(
        LogLine(str(r.get("level", "")), str(r.get("logger", "")), str(r.get("msg", "")))
        for r in records
        if r.get("k") == "vllm_log"
    )


def _runner(rec: dict[str, Any]) -> RunnerEvidence | None:
    """The live runner a ``runner`` record names (None: no runner recorded)."""
    if not rec:
        return None
    mro = rec.get("mro")
    return RunnerEvidence(
        cls=str(rec.get("class")),
        file=_opt_str(rec.get("file")),
        sha256=_opt_str(rec.get("sha256")),
        mro=tuple(str(c) for c in mro) if isinstance(mro, list) else (),
    )


def _with_graph(
    steps: StepEvidence, graph: dict[str, Any], spec: SpecEvidence | None
) -> StepEvidence:
    """STEPS with the mode they ran in (a ``graph`` record) and their speculation."""
    eager = graph.get("enforce_eager")
    return dataclasses.replace(
        steps,
        compilation_mode=_opt_str(graph.get("compilation_mode")),
        cudagraph_mode=_opt_str(graph.get("cudagraph_mode")),
        enforce_eager=eager if isinstance(eager, bool) else None,
        spec=spec,
    )


def read_probe_dir(
    directory: Path, cache: JournalCache | None = None, holder: Holder | None = None
) -> ProbeState | None:
    """Parse one probe directory; None when it holds no probe state. CACHE: reuse what an
    earlier read of the same journal parsed (counters are always read fresh). The journal is
    written by the probed process: a field of the wrong type reads as absent, never raises.
    HOLDER: the process the directory must belong to; raises ``binding.Unbound`` when the
    files are not the ones it holds (see ``binding``), and reads only the files checked. A
    probe with private counters (``shared: false``) is read without counts then."""
    journal = directory / L.JOURNAL_FILE
    if holder is not None and journal.is_symlink():
        raise symlink(L.JOURNAL_FILE)
    cached = cache.records(journal) if cache is not None else None
    if cached is not None:
        records, files, digest = cached.records, cached.files, cached.digest
        hashed_at, fid = cached.hashed_at, (cached.dev, cached.ino)
    else:
        got = _read_file(journal)
        records = _parse(got[0].split(b"\n")) if got is not None else []
        fid = got[1] if got is not None else (0, 0)
        files, hashed_at = _files(records)
        digest = _digest(files)
    start = next((r for r in records if r.get("k") == "start"), None)
    if start is None:
        return None
    bindings: frozenset[FileId] | None = None
    if holder is not None:
        holder.check_journal(fid, start)
        opened: dict[str, Any] = next(
            (r for r in reversed(records) if r.get("k") == "bindings_fd"), {}
        )
        bindings = _bindings_file(directory, holder, opened.get("fd"))
    private = holder is not None and start.get("shared") is False
    slots = None if private else read_settled(directory / L.COUNTERS_FILE, holder)
    slots = slots or [0] * L.N_SLOTS
    runner_rec: dict[str, Any] = next((r for r in reversed(records) if r.get("k") == "runner"), {})
    graph: dict[str, Any] = next((r for r in reversed(records) if r.get("k") == "graph"), {})
    methods = runner_rec.get("methods")
    return ProbeState(
        directory=str(directory),
        pid=_int(start.get("pid")),
        start_ticks=_int(start.get("start_ticks")),
        mode=str(start.get("mode", "")),
        shared=bool(start.get("shared")),
        roles=[r for r in records if r.get("k") == "role"],
        runner=_runner(runner_rec),
        steps=_with_graph(steps_of(slots), graph, _speculation(records, slots)),
        hooks=_hooks(records, slots),
        files=files,
        hashed_at=hashed_at,
        errors=[r for r in records if r.get("k") == "error"],
        error_count=slots[L.S_PROBE_ERRORS],
        manifest_digest=digest,
        interp=next((r for r in reversed(records) if r.get("k") == "interp"), {}),
        graph=graph,
        runner_worker=_opt_str(runner_rec.get("worker")),
        runner_methods=methods if isinstance(methods, dict) else {},
        runner_log=_log_lines(records),
        step_errors=tuple(
            (_int(r.get("step")), str(r.get("error")))
            for r in records
            if r.get("k") == "step_raised"
        ),
        fileless=tuple(
            (str(r.get("module")), str(r.get("claimed")))
            for r in records
            if r.get("k") == "fileless"
        ),
        bindings_file=bindings,
        journal_file=fid if holder is not None else None,
    )


def _bindings_file(directory: Path, holder: Holder, hint: object) -> frozenset[FileId]:
    """The (device, inode) of DIRECTORY's ``bindings.jsonl`` when HOLDER holds it open (empty:
    there is none yet); raises ``Unbound`` for one it does not hold. HINT: the descriptor the
    probe journaled for it."""
    try:
        st = os.lstat(directory / L.BINDINGS_FILE)
    except OSError:
        return frozenset()
    if stat.S_ISLNK(st.st_mode):
        raise symlink(L.BINDINGS_FILE)
    holder.check_bindings((st.st_dev, st.st_ino), hint)
    return frozenset({(st.st_dev, st.st_ino)})
