"""Evidence of live processes read on this machine (no agent, no verifier), and stored
reports written by ``verifier inspect --json``: what ``inspect``, ``diff`` and
``policy init`` work from."""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from servewitness import wire
from servewitness.errors import ConfigError, ProcessExited, UsageError
from servewitness.evidence.distindex import Sites
from servewitness.evidence.hashing import Hasher
from servewitness.evidence.judge import dist_index
from servewitness.evidence.process import ProcessEvidence, read_process, read_tree, still_running
from servewitness.evidence.procfs import ProcFS
from servewitness.evidence.report import report_with_judgement
from servewitness.model import ProcessReport

# Preference when one process of a tree stands for it: the one that runs the model.
_ROLE_ORDER = ("worker", "engine_core", "api_server")


def read_local(procfs: ProcFS, pid: int, tree: bool) -> list[tuple[ProcessEvidence, ProcessReport]]:
    """Each process (PID, and with TREE every Python process under it) with the agent's own
    judgement of it: native mappings, the cross-check, provenance classes and drift.

    A process that exited while it was read (its files then read as "missing", its maps as
    empty) has no report: PID itself raises ProcessExited; a process under it is left out,
    with a warning on stderr, as is one under it that could not be read at all."""
    hasher = Hasher()
    # the site-packages a tree's processes share are parsed once for all of them (as the
    # agent does per collect: distindex.Sites, shared between processes of one view only)
    sites = Sites()
    skipped: list[str] = []
    found = read_tree(procfs, pid, skipped) if tree else [read_process(procfs, pid)]
    out = []
    for ev in found:
        index = dist_index(procfs, ev.identity.pid, sites)
        report, _ = report_with_judgement(procfs, ev, hasher, index=index)
        if alive(procfs, ev):
            out.append((ev, report))
        elif ev.identity.pid == pid:
            raise ProcessExited(pid)
        else:
            skipped.append(f"pid {ev.identity.pid} (under {pid}) exited while it was being read")
    log = structlog.get_logger("verifier.inspect")
    for why in skipped:
        log.warning("process left out", pid=pid, detail=why)
    return out


def alive(procfs: ProcFS, ev: ProcessEvidence) -> bool:
    """Whether the process EV describes is still there and not a zombie (an exited process
    its parent has not reaped keeps its pid and start time, but no memory or files)."""
    if not still_running(procfs, ev):
        return False
    try:
        stat = (procfs.root / str(ev.identity.pid) / "stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rindex(b")") + 2 :].split()
    return bool(fields) and fields[0] not in (b"Z", b"X")


def pick(reports: list[ProcessReport], role: str | None, source: str) -> ProcessReport:
    """The one process that stands for SOURCE: of ROLE if given, else the one that runs the
    model (a worker, else an engine core with a live runner, else the API server)."""
    probed = [r for r in reports if r.probe_present]
    if role is not None:
        hits = [r for r in probed if r.role == role]
        if not hits:
            raise UsageError(f"{source}: no probed process with role {role}")
        return hits[0]
    for want in _ROLE_ORDER:
        hits = [r for r in probed if r.role == want and (want != "engine_core" or r.runner)]
        if hits:
            return hits[0]
    if probed:
        return probed[0]
    raise UsageError(f"{source}: no process with the probe, so nothing it loaded is known")


def load_side(spec: str, role: str | None, procfs: ProcFS) -> tuple[str, ProcessReport]:
    """SPEC is a pid (a live process tree, read now) or a file written by
    ``verifier inspect --json``. Returns a label for it and the process that stands for it."""
    where, reports = load_tree(spec, procfs)
    chosen = pick(reports, role, where)
    return side_label(where, chosen), chosen


def side_label(where: str, chosen: ProcessReport) -> str:
    """How CHOSEN, picked from what ``load_tree`` labelled WHERE, is named in output:
    ``pid 42 (worker)``, or ``boot-a.json pid 42 (worker)`` for a stored file."""
    prefix = "" if where.startswith("pid ") else f"{where} "
    return f"{prefix}pid {chosen.key.pid} ({chosen.role})"


def load_tree(spec: str, procfs: ProcFS) -> tuple[str, list[ProcessReport]]:
    """Every process SPEC names (``load_side``'s SPEC), with a label for where they came
    from: "pid N" or the file's path."""
    if spec.isascii() and spec.isdigit():
        pid = int(spec)
        if pid <= 0:
            raise UsageError(f"pid must be a positive integer, got {spec}")
        return f"pid {pid}", [r for _, r in read_local(procfs, pid, tree=True)]
    return str(spec), load_stored(Path(spec))


def load_stored(path: Path) -> list[ProcessReport]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as e:
        raise UsageError(
            f"{path}: no such file (give a pid or a `verifier inspect --json` file)"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path}: not JSON ({e}); expected `verifier inspect --json` output"
        ) from e
    procs = data.get("processes") if isinstance(data, dict) else None
    if not isinstance(procs, list):
        raise ConfigError(f'{path}: no "processes" list; expected `verifier inspect --json` output')
    reports = []
    for i, p in enumerate(procs):
        if not isinstance(p, dict) or "report" not in p:
            raise ConfigError(
                f'{path}: processes[{i}] has no "report" (written by an older verifier?)'
            )
        try:
            reports.append(wire.process_from_json(p["report"], f"processes[{i}].report"))
        except wire.WireError as e:
            raise ConfigError(f"{path}: {e}") from e
    return reports
