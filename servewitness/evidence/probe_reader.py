"""Read a probe's state directory (journal + shared counters) without its cooperation.

The evidence it reads is returned as ``servewitness.model`` types (steps, hooks, files, the live
runner, speculation, vLLM's log lines): the same values the agent reports. ``ProbeState``
adds what only the journal holds (the probe's mode, roles, errors, the interpreter's layout,
the raw graph record, the runner's worker and step-method files), for ``verifier inspect``.
Given the process the directory must belong to (``binding.Holder``), only files that process
holds are read.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servewitness_probe import layout as L

from servewitness.evidence.binding import FileId, Holder, symlink
from servewitness.evidence.code_records import chains
from servewitness.evidence.counters import read_counters, read_settled, steps_of
from servewitness.evidence.journal import (
    JournalCache,
    digest_of,
    journal_problems,
    manifest_of,
    parse_text,
    read_file,
)
from servewitness.evidence.places import import_entry
from servewitness.model import (
    MAX_CHILDREN,
    CodeChain,
    FileEntry,
    HookEvidence,
    LogLine,
    RunnerEvidence,
    SpecEvidence,
    StepEvidence,
)

ROLE_RANK = {"worker": 3, "engine_core": 2, "api_server": 1}


@dataclass(frozen=True)
class UnfiledModule:
    """A module the probe saw run code that no file record holds (an ``unfiled`` record):
    HOW is ``loader`` (a custom loader executed it), ``exec`` (source compiled from no file
    was executed into a module without a spec), ``stdin`` or ``interactive`` (the main
    module read from standard input, or typed at a prompt)."""

    module: str
    how: str
    loader: str | None = None  # the loader's class, "module.Qualname"
    loader_file: str | None = None  # the file defining that class, as its code says
    # the files of the other code that methods set on the loader instance carry (a partial's
    # bound callables, a second override; None: code no file holds): ``_loaders._carried``
    also: tuple[str | None, ...] = ()
    file: str | None = None  # the module's __file__ (how: exec, the filename its code names)
    source_sha256: str | None = None  # of what the loader's get_source gave
    source_size: int | None = None


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
    # Every directory sys.path named whenever the probe recorded it (at its start, and at each
    # sweep that found it changed), absolute: an entry removed since still counts.
    import_path: tuple[str, ...] = ()
    start_cwd: str | None = None  # the working directory of the first interp record
    # the start record's CLOCK_BOOTTIME, in seconds (the process's word; checked in report)
    started_boottime: float | None = None
    # (pid in its namespace, start ticks) of each process its code started (``child``
    # records, ``_children``), in order, at most MAX_CHILDREN
    children: tuple[tuple[int, int], ...] = ()
    # Modules that claim a file (__file__ or spec.origin) where there is none: module, claimed.
    fileless: tuple[tuple[str, str], ...] = ()
    # Modules that ran code no file record holds (custom loaders, exec, standard input).
    unfiled: tuple[UnfiledModule, ...] = ()
    # The compile / graph mode the runner ran in, as journaled (enforce_eager,
    # compilation_mode, cudagraph_mode, device); ``steps`` carries the typed fields.
    graph: dict[str, Any] = field(default_factory=dict)
    # The live runner's worker class and, per step method, the class and file defining it
    # (None: no runner recorded).
    runner_worker: str | None = None
    runner_methods: dict[str, Any] = field(default_factory=dict)
    # When the probe hashed each file (the process's wall clock), by path, where recorded.
    hashed_at: dict[str, float] = field(default_factory=dict)
    # Why the journal is not the one the probe wrote (a record deleted, inserted, reordered,
    # cut off, or changed after the agent read it): empty when nothing says so.
    journal_problems: tuple[str, ...] = ()
    # vLLM's log lines about the model runner (why it chose the one it did), in order.
    runner_log: tuple[LogLine, ...] = ()
    # The first execute_model errors (the probe journals a few; steps.raised counts all):
    # step (the number it would have had), error ("RuntimeError: ...").
    step_errors: tuple[tuple[int, str], ...] = ()
    # What runs each step method and declared hook target, as recorded (not yet verified:
    # ``codecheck.check_chains``).
    code: tuple[CodeChain, ...] = ()
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


def _opt_count(v: object) -> int | None:
    """V when it is a count (a non-negative int, not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _children(records: list[dict[str, Any]]) -> tuple[tuple[int, int], ...]:
    """The (pid, start ticks) of each ``child`` record with both as numbers, first seen
    first, at most MAX_CHILDREN (what the probe journals at most)."""
    out: dict[tuple[int, int], None] = {}
    for r in records:
        if r.get("k") != "child":
            continue
        pid, ticks = r.get("pid"), r.get("start_ticks")
        if isinstance(pid, int) and isinstance(ticks, int) and min(pid, ticks) >= 0:
            out.setdefault((int(pid), int(ticks)), None)  # int(): a bool is an int
            if len(out) >= MAX_CHILDREN:
                break
    return tuple(out)


def _seconds(v: object) -> float | None:
    """A finite, non-negative number of seconds written by the probed process, or None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if 0 <= v < 1e12 else None  # NaN fails both comparisons


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


def _live_runner(records: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The runner record of the live runner and the graph record made with it. A runner
    record says which runner the probe saw (the warm-up wrapper records any object it is
    called on); a ``stepped`` record, which runner a completed step ran on. The live runner
    is the latest runner record of the class the latest step ran on; with no step recorded
    (none yet, or a probe from before these records), the latest runner record."""
    want = next((r.get("class") for r in reversed(records) if r.get("k") == "stepped"), None)
    at = next(
        (
            i
            for i in range(len(records) - 1, -1, -1)
            if records[i].get("k") == "runner" and (want is None or records[i].get("class") == want)
        ),
        None,
    )
    if at is None:
        return {}, next((r for r in reversed(records) if r.get("k") == "graph"), {})
    graph: dict[str, Any] = next((r for r in reversed(records[:at]) if r.get("k") == "graph"), {})
    return records[at], graph


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


def _read_journal(
    journal: Path, cache: JournalCache | None
) -> tuple[list[dict[str, Any]], tuple[FileEntry, ...], dict[str, float], str, str | None, FileId]:
    """Records, files, when each was hashed, manifest digest, how the journal was seen
    rewritten, and which file it is (device, inode; (0, 0): none could be read)."""
    cached = cache.records(journal) if cache is not None else None
    if cached is not None:
        fid = (cached.dev, cached.ino)
        return (
            cached.records, cached.files, cached.hashed_at, cached.digest, cached.rewritten, fid
        )  # fmt: skip
    got = read_file(journal)
    records = parse_text(got[0]) if got is not None else []
    files, hashed_at = manifest_of(records)
    return records, files, hashed_at, digest_of(files), None, got[1] if got else (0, 0)


JOURNAL_SETTLE_TRIES = 10  # reads while one record counted by the probe is not in the journal
JOURNAL_SETTLE_PAUSE_S = 0.005  # ... at this pause (a write takes microseconds)


def read_probe_dir(
    directory: Path, cache: JournalCache | None = None, holder: Holder | None = None
) -> ProbeState | None:
    """Parse one probe directory; None when it holds no probe state. CACHE: reuse what an
    earlier read of the same journal parsed (counters are always read fresh). The journal is
    written by the probed process: a field of the wrong type reads as absent, never raises;
    a journal that is not the one the probe wrote (``journal_problems``) is read as it is,
    and ``ProbeState.journal_problems`` says why it cannot be trusted.
    HOLDER: the process the directory must belong to; raises ``binding.Unbound`` when the
    files are not the ones it holds (see ``binding``), and reads only the files checked. A
    probe with private counters (``shared: false``) is read without counts then."""
    journal, counters = directory / L.JOURNAL_FILE, directory / L.COUNTERS_FILE
    if holder is not None and journal.is_symlink():
        raise symlink(L.JOURNAL_FILE)
    # The probe counts a record before it writes it, under one lock: read the count, the
    # journal, the count again, and an honest journal holds between the first count less the
    # one record that may be mid-write, and the second count.
    for _ in range(JOURNAL_SETTLE_TRIES):
        before = read_counters(counters)
        records, files, hashed_at, digest, rewritten, fid = _read_journal(journal, cache)
        after = read_counters(counters)
        # One record short of the first count: it may be mid-write (a few microseconds), or
        # the last record was deleted. Read again until it arrives; if it never does, the
        # shortfall is reported.
        if before is None or after is None or rewritten:
            break
        if len(records) != before[L.S_JOURNAL_RECORDS] - 1:
            break
        time.sleep(JOURNAL_SETTLE_PAUSE_S)
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
    # Read once more, bound to the process and between two steps: the counts judged, and
    # (read after the journal) the probe's count of records to hold the journal against.
    slots = None if private else read_settled(counters, holder)
    counted = None
    if before is not None and slots is not None:
        counted = (before[L.S_JOURNAL_RECORDS], slots[L.S_JOURNAL_RECORDS])
    problems = tuple(journal_problems(records, counted, rewritten))
    slots = slots or [0] * L.N_SLOTS
    runner_rec, graph = _live_runner(records)
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
        journal_problems=problems,
        errors=[r for r in records if r.get("k") == "error"],
        error_count=slots[L.S_PROBE_ERRORS],
        manifest_digest=digest,
        interp=next((r for r in reversed(records) if r.get("k") == "interp"), {}),
        import_path=import_path(r for r in records if r.get("k") == "interp"),
        start_cwd=_start_cwd(records),
        started_boottime=_seconds(start.get("boottime")),
        children=_children(records),
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
        code=chains(records),
        bindings_file=bindings,
        journal_file=fid if holder is not None else None,
        unfiled=tuple(_unfiled(r) for r in records if r.get("k") == "unfiled"),
    )


def _unfiled(rec: dict[str, Any]) -> UnfiledModule:
    """An ``unfiled`` record (written by the probed process: a field of the wrong type reads
    as absent; an unknown ``how`` stays as written, and the agent judges it unfiled)."""
    return UnfiledModule(
        module=str(rec.get("module")),
        how=str(rec.get("how")),
        loader=_opt_str(rec.get("loader")),
        loader_file=_opt_str(rec.get("loader_file")),
        also=_also(rec.get("also")),
        file=_opt_str(rec.get("file")),
        source_sha256=_opt_str(rec.get("source_sha256")),
        source_size=_opt_count(rec.get("source_size")),
    )


_MAX_ALSO = 32


def _also(v: object) -> tuple[str | None, ...]:
    """An ``unfiled`` record's ``also``: absent is none; anything but a list of at most
    _MAX_ALSO entries reads as one piece of code no file holds (never as nothing)."""
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > _MAX_ALSO:
        return (None,)
    return tuple(_opt_str(x) for x in v)


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


def import_path(records: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The union of the ``sys.path`` entries of RECORDS (the probe's ``interp`` records), each
    made absolute against the working directory its record names (``""`` is that directory),
    in the order first seen; entries that are not strings, and relative ones of a record
    without a working directory, are left out."""
    out: dict[str, None] = {}
    for r in records:
        path, cwd = r.get("path"), r.get("cwd")
        if isinstance(path, list):
            cwd = cwd if isinstance(cwd, str) else None
            got = (import_entry(e, cwd) for e in path if isinstance(e, str))
            out.update(dict.fromkeys(g for g in got if g is not None))
    return tuple(out)


def _start_cwd(records: list[dict[str, Any]]) -> str | None:
    first = next((r for r in records if r.get("k") == "interp"), {})
    cwd = first.get("cwd")
    return cwd if isinstance(cwd, str) and cwd.startswith("/") else None
