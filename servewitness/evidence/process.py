"""One process's evidence: what ``/proc`` shows, plus its probe's state when present."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servewitness_probe import layout as L

from servewitness.errors import NotPythonProcess, UnavailableError
from servewitness.evidence.binding import Holder, Unbound
from servewitness.evidence.bindings_reader import BindingsReader
from servewitness.evidence.journal import JournalCache
from servewitness.evidence.probe_reader import ProbeState, read_probe_dir
from servewitness.evidence.procfs import ProcessIdentity, ProcFS
from servewitness.model import HookEvidence

OFFLINE = "offline"  # the front end of vllm.LLM (LLMEngine) in a script: no API server
OFFLINE_FRONT_END_NOTE = (
    "offline front end (vllm.LLM / LLMEngine in this script, no API server): its requests "
    "carry the script's own ids, never a client's X-Request-Id; the steps run in the "
    "processes under it"
)
OFFLINE_ONE_PROCESS_NOTE = (
    "offline use in one process (VLLM_ENABLE_V1_MULTIPROCESSING=0): this process is the "
    "front end (vllm.LLM / LLMEngine), the engine core and the worker; no API server, so "
    "its requests carry the script's own ids, never a client's X-Request-Id"
)


PRIVATE_COUNTERS_NOTE = (
    "the probe could not create shared state (its counters are private to the process, see "
    "its errors): steps and hook fires cannot be read from outside and read as zero"
)


def raised_note(raised: int, errors: tuple[tuple[int, str], ...] = ()) -> str:
    """What RAISED execute_model calls that raised mean for the counts."""
    first = f"; the first: {errors[0][1]}" if errors else ""
    return (
        f"{raised} execute_model call(s) raised and are not counted as steps (a driver that "
        "calls execute_model again before sample_tokens, or expects its output where the "
        f"two-phase protocol returns none, gets this){first}"
    )


_TITLE = re.compile(r"^VLLM::(?P<name>[A-Za-z]+)(?:_.*?TP(?P<tp>\d+))?")

# Hook status, from most to least severe; "firing" and "idle" are not failures by themselves.
NOT_LOADED = "not_loaded"
UNRESOLVED = "unresolved"
NOT_INSTANTIATED = "not_instantiated"
NOT_FIRING = "not_firing"
FIRING = "firing"
IDLE = "idle"  # no fires and no steps in this process: nothing to conclude here


@dataclass(frozen=True)
class HookView:
    """A hook as judged in one process, with that process's step counts beside the fire count."""

    record: HookEvidence
    steps: int
    productive: int
    status: str
    why: str
    live_runner_is_instance: bool | None

    def as_dict(self) -> dict[str, Any]:
        r = self.record
        return {
            "name": r.name,
            "target": r.target,
            "source": r.source,
            "module_loaded": r.module_loaded,
            "wrapped": r.wrapped,
            "owner": r.owner,
            "instantiated": None if r.how != "method" else r.instantiated_class is not None,
            "instantiated_class": r.instantiated_class,
            "live_runner_is_instance": self.live_runner_is_instance,
            "fired": r.fired,
            "fired_on_productive_steps": r.fired_productive,
            "fired_on_prefill_steps": r.fired_prefill,
            "fired_on_decode_steps": r.fired_decode,
            "fired_outside_steps": r.fired_outside,
            "device_fired": r.device_fired,
            "device": r.device,
            "device_base": r.device_base,
            "device_base_step": r.device_base_step,
            "first_step": r.first_step,
            "last_step": r.last_step,
            "steps": self.steps,
            "productive_steps": self.productive,
            "status": self.status,
            "why": self.why,
        }


def judge_hook(rec: HookEvidence, probe: ProbeState) -> HookView:
    """Classify one hook in one process; an empty count always says why it is empty."""
    steps, productive = probe.steps.total, probe.steps.productive
    live_is = None
    if rec.how == "method" and rec.owner and probe.runner is not None:
        live_is = rec.owner in probe.runner.mro
    module = rec.target.partition(":")[0]
    live = probe.runner.cls if probe.runner else "none recorded"
    if not rec.module_loaded:
        status, why = NOT_LOADED, f"module {module} was never imported in this process"
    elif rec.unresolved:
        status, why = UNRESOLVED, f"module imported but target not found: {rec.unresolved}"
    elif rec.how == "method" and rec.instantiated_class is None and rec.fired == 0:
        status = NOT_INSTANTIATED
        why = f"module imported but class {rec.owner} never instantiated (live runner: {live})"
    elif rec.how == "method" and rec.instantiated_class is None:
        # An instance method fired on no instance of its class: called on an object made
        # without its constructor (object.__new__), or its count written from elsewhere.
        status = NOT_INSTANTIATED
        why = (
            f"fired {rec.fired} times, but class {rec.owner} was never instantiated: not "
            f"the live path (live runner: {live})"
        )
    elif rec.fired > 0:
        status = FIRING
        why = (
            f"fired {rec.fired} times over {steps} steps; {rec.fired_productive} of them on "
            f"{productive} productive steps"
        )
    elif steps > 0:
        status, why = NOT_FIRING, f"loaded but fired 0 times while {steps} steps ran"
    else:
        status, why = IDLE, "no fires and no engine steps in this process"
    return HookView(rec, steps, productive, status, why, live_is)


@dataclass(frozen=True)
class ProcessEvidence:
    identity: ProcessIdentity
    role: str
    rank: int | None
    probe: ProbeState | None
    probe_dir: str
    note: str | None = None
    # State directories found under this process's name and refused, each "<dir>: <why>":
    # the process does not hold their files (``binding``). Only when ``probe`` is None.
    unbound: tuple[str, ...] = ()

    @property
    def hooks(self) -> list[HookView]:
        return [judge_hook(h, self.probe) for h in self.probe.hooks] if self.probe else []

    @property
    def roles(self) -> list[str]:
        """Every role the probe recorded for this process (``role`` is the most specific)."""
        if self.probe is None:
            return []
        return sorted({str(r.get("role")) for r in self.probe.roles if r.get("role")})

    @property
    def engine(self) -> dict[str, Any]:
        """How the engine core in this process steps, as recorded at its first request:
        ``async_scheduling``, ``batch_queue`` (its size; > 1 runs ``step_with_batch_queue``)
        and ``step`` (the step function). Empty where no engine core ran here."""
        for r in self.probe.roles if self.probe else []:
            if r.get("role") == "engine_core" and "step" in r:
                return {k: r.get(k) for k in ("async_scheduling", "batch_queue", "step")}
        return {}

    @property
    def notes(self) -> list[str]:
        """Where this process's evidence is weaker than a server's, said plainly."""
        out = []
        roles = set(self.roles)
        if OFFLINE in roles:
            one = roles & {"engine_core", "worker"}
            out.append(OFFLINE_ONE_PROCESS_NOTE if one else OFFLINE_FRONT_END_NOTE)
        if self.probe is not None and self.probe.steps.raised:
            out.append(raised_note(self.probe.steps.raised, self.probe.step_errors))
        if self.probe is not None and not self.probe.shared:
            out.append(PRIVATE_COUNTERS_NOTE)
        return out

    def as_dict(self) -> dict[str, Any]:
        ident, p = self.identity, self.probe
        runner = p.runner if p else None
        return {
            "pid": ident.pid,
            "ns_pid": ident.ns_pid,
            "ppid": ident.ppid,
            "start_time": ident.start_time,
            "start_ticks": ident.start_ticks,
            "boot_id": ident.boot_id,
            "cmdline": list(ident.cmdline),
            "exe": ident.exe,
            "role": self.role,
            "rank": self.rank,
            "roles": self.roles,
            "notes": self.notes,
            "engine": self.engine,
            "probe": {
                "present": p is not None,
                "dir": self.probe_dir,
                "state_dir": p.directory if p else None,
                "unbound": list(self.unbound),
                "mode": p.mode if p else None,
                "shared_memory": p.shared if p else None,
                "errors": [{"where": e.get("where"), "msg": e.get("msg")} for e in p.errors]
                if p
                else [],
                "note": self.note,
                # why its journal is not the one it wrote (evidence.journal.edited)
                "journal_problems": list(p.journal_problems) if p else [],
            },
            "runner": {
                "class": runner.cls if runner else None,
                "file": runner.file if runner else None,
                "sha256": runner.sha256 if runner else None,
                "worker": p.runner_worker if p else None,
                "methods": p.runner_methods if p else {},
                # vLLM's own log lines about the model runner (why it chose this one)
                "log": [
                    {"level": x.level, "logger": x.logger, "message": x.message}
                    for x in (p.runner_log if p else ())
                ],
            },
            "steps": {
                "total": p.steps.total if p else None,
                "productive": p.steps.productive if p else None,
                "empty": p.steps.empty if p else None,
                "tokens_scheduled": p.steps.tokens_scheduled if p else None,
                "requests_scheduled": p.steps.requests_scheduled if p else None,
                "requests_max": p.steps.requests_max if p else None,
                "last_step_unix_ns": p.steps.last_step_unix_ns if p else None,
                "prefill": p.steps.prefill_steps if p else None,
                "decode": p.steps.decode_steps if p else None,
                "prefill_tokens": p.steps.prefill_tokens if p else None,
                "decode_tokens": p.steps.decode_tokens if p else None,
                "dummy": p.steps.dummy_steps if p else None,
                "raised": p.steps.raised if p else None,
                "errors": [{"step": n, "error": e} for n, e in p.step_errors] if p else [],
                "graph": dict(p.graph) if p else {},
                "speculation": _speculation(p),
            },
            "hooks": [h.as_dict() for h in self.hooks],
            # What runs each step method and declared hook target, layer by layer, as the
            # probe recorded it (inspect shows it as verified against the files: its "code").
            "code": [dataclasses.asdict(c) for c in p.code] if p else [],
            "manifest": {
                "digest": p.manifest_digest if p else None,
                "files": len(p.files) if p else None,
                "by_origin": _count(p, "at") if p else {},
                "by_kind": _count(p, "kind") if p else {},
            },
        }


def _speculation(p: ProbeState | None) -> dict[str, Any] | None:
    """Speculative decoding as the probe recorded it; None: not recorded (no runner)."""
    sp = p.steps.spec if p else None
    if sp is None:
        return None
    return {
        "on": sp.on,
        "method": sp.method,
        "num_speculative_tokens": sp.num_speculative_tokens,
        "steps": sp.steps,
        "drafts": sp.drafts,
        "draft_tokens": sp.draft_tokens,
        "accepted_tokens": sp.accepted_tokens,
        "acceptance_rate": sp.accepted_tokens / sp.draft_tokens if sp.draft_tokens else None,
        "accepted_per_position": list(sp.accepted_per_position),
        "emitted_tokens": sp.emitted_tokens,
        "unread_steps": sp.unread_steps,
    }


def _count(p: ProbeState, attr: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in p.files:
        key = str(getattr(f, attr))
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _role_from_title(ident: ProcessIdentity) -> tuple[str, int | None]:
    title = " ".join(ident.cmdline)
    m = _TITLE.match(title)
    if m:
        name = m.group("name")
        tp = m.group("tp")
        if name == "Worker":
            return "worker", int(tp) if tp else None
        if name == "EngineCore":
            return "engine_core", None
        if name == "APIServer":
            return "api_server", None
    if any(a.startswith("vllm.entrypoints") for a in ident.cmdline) or (
        len(ident.cmdline) > 1 and ident.cmdline[1] == "serve"
    ):
        return "api_server", None
    if any("multiprocessing.resource_tracker" in a for a in ident.cmdline):
        return "helper", None
    return "unknown", None


def probe_dirs_of(procfs: ProcFS, pid: int) -> list[str]:
    """Where PID's probe state may be, most likely first: the probe directory in its own
    environment, then in each ancestor's, then the default. vLLM names its processes with
    setproctitle, which on Linux reuses the argv+environ block for the title: afterwards
    ``/proc/<pid>/environ`` shows zeros or other bytes (seen in containers: EngineCore's
    showed variables vLLM set later and not the probe's), while the environment the process
    really runs with is the one its parent handed down. Trying several places cannot pick
    another process's state: a directory is taken only when the process holds its files
    (``binding``)."""
    out: dict[str, None] = {}
    seen: set[int] = set()
    while pid > 0 and pid not in seen and len(seen) < 16:
        seen.add(pid)
        try:
            value = procfs.environ(pid).get(L.ENV_PROBE_DIR)
        except (UnavailableError, OSError):
            value = None
        if value:
            out.setdefault(value, None)
        try:
            pid = procfs.identity(pid).ppid
        except (UnavailableError, OSError):
            break
    out.setdefault(L.DEFAULT_PROBE_DIR, None)
    return list(out)


def state_dir_names(procfs: ProcFS, ident: ProcessIdentity) -> list[str]:
    """The names IDENT's probe state may have, in the order tried: the name a probe gives it
    (boot id, PID namespace, pid, start time), then an older probe's ``<pid>-<start ticks>``."""
    pid_ns = procfs.pid_ns(ident.pid)
    names = [] if pid_ns is None else [
        L.process_dir_name(ident.boot_id, pid_ns, ident.ns_pid, ident.start_ticks)
    ]  # fmt: skip
    return [*names, L.legacy_dir_name(ident.ns_pid, ident.start_ticks)]


def read_process(procfs: ProcFS, pid: int, cache: JournalCache | None = None) -> ProcessEvidence:
    """Evidence for PID. Raises NoSuchProcess / NotPythonProcess / ProcessAccessDenied (also
    when a state directory is found and /proc will not show what PID holds: its binding cannot
    be checked). A directory under PID's name whose files PID does not hold is refused, and
    said (``unbound``): PID is then reported without a probe."""
    ident = procfs.identity(pid)
    if not procfs.is_python(pid):
        raise NotPythonProcess(pid, ident.exe)
    pdirs = probe_dirs_of(procfs, pid)
    names = state_dir_names(procfs, ident)
    holder = Holder(procfs, pid, ident.ns_pid, ident.start_ticks)
    probe = None
    pdir = pdirs[0]
    candidates = [(d, procfs.in_root(pid, d) / n) for d in pdirs for n in names]
    candidates += [(d, Path(d) / n) for d in pdirs for n in names]
    refused: dict[tuple[int, int], str] = {}  # by the directory's (device, inode): seen once
    for where, candidate in candidates:
        try:
            probe = read_probe_dir(candidate, cache, holder)
        except PermissionError:
            probe = None
        except Unbound as e:
            try:
                st = candidate.stat()
            except OSError:
                continue
            refused.setdefault((st.st_dev, st.st_ino), f"{candidate}: {e.why}")
            continue
        if probe is not None:
            pdir = where
            break
    role, rank = probe.role if probe else (None, None)
    if role is None:
        role, rank = _role_from_title(ident)
    unbound = () if probe is not None else tuple(refused.values())
    note = None
    if unbound:
        note = (
            "probe absent: state found under this process's name is not its own (the kernel "
            f"does not show the process holding its files), refused: {'; '.join(unbound)}"
        )
    elif probe is None:
        note = (
            f"probe absent: no state for this process under {' or '.join(pdirs)} (is the "
            "package installed in "
            "its environment, and was it started by vLLM's plugin loader or VERIFIER_PROBE_EARLY?)"
        )
    return ProcessEvidence(ident, role, rank, probe, pdir, note, unbound)


def read_tree(procfs: ProcFS, pid: int, skipped: list[str] | None = None) -> list[ProcessEvidence]:
    """Evidence for PID and every Python process under it (non-Python children are skipped).
    SKIPPED: where to note each child that could not be read (it exited mid-scan, or /proc
    refused it), so that it does not vanish from the evidence unsaid."""
    out = [read_process(procfs, pid)]
    for child in procfs.descendants(pid)[1:]:
        try:
            out.append(read_process(procfs, child))
        except NotPythonProcess:
            continue  # not Python: not part of the evidence
        except (UnavailableError, OSError) as e:  # exited mid-scan, or not readable
            if skipped is not None:
                why = e.explain() if isinstance(e, UnavailableError) else str(e)
                skipped.append(f"pid {child} (under {pid}) was not read: {why}")
    return out


def tree_notes(evidence: list[ProcessEvidence]) -> tuple[list[str], dict[str, int]]:
    """What a whole process tree's evidence lacks next to a server's, and its request ids:
    how many requests the step-running processes bound to steps (``bound``; closed ones,
    as written to ``bindings.jsonl``), how many of those have a front-end id (``ext``: an
    API server's or vllm.LLM's record of the request) and how many a client's X-Request-Id
    (``client``). A request bound to steps with no front-end id was driven without vLLM's
    front end (a script calling the engine core or the executor directly)."""
    notes: list[str] = []
    spans: dict[str, None] = {}
    exts: dict[str, bool] = {}
    for ev in evidence:
        if ev.probe is None:
            continue
        got, ids = BindingsReader().read(Path(ev.probe.directory), ev.probe.bindings_file)
        spans.update((s.internal_id, None) for s in got)
        for e in ids:
            exts[e.internal_id] = exts.get(e.internal_id, False) or e.x_request_id is not None
    counts = {
        "bound": len(spans),
        "ext": sum(1 for i in spans if i in exts),
        "client": sum(1 for i in spans if exts.get(i)),
    }
    roles = {r for ev in evidence for r in (ev.roles or [ev.role])}
    steps = any(ev.probe is not None and ev.probe.steps.total > 0 for ev in evidence)
    if "api_server" not in roles and (steps or roles & {OFFLINE, "engine_core", "worker"}):
        notes.append(
            "no API server in this process tree (offline use, or a script driving vLLM "
            "directly): no request carries a client's X-Request-Id, so an audit by client "
            "request id finds nothing here; steps, hooks, runner and manifest are as complete "
            "as a server's"
        )
    unbound = counts["bound"] - counts["ext"]
    if unbound:
        notes.append(
            f"{unbound} of {counts['bound']} requests bound to steps have no front-end id: "
            "their steps were driven without vLLM's front end (e.g. a script calling the "
            "executor's execute_model directly), so only the engine's internal ids name them"
        )
    return notes, counts


def still_running(procfs: ProcFS, ev: ProcessEvidence) -> bool:
    """Whether the process EV describes is still there (same pid, same start)."""
    try:
        return procfs.identity(ev.identity.pid).start_ticks == ev.identity.start_ticks
    except (UnavailableError, OSError):
        return False
