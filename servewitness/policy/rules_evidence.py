"""The always-on evidence rules: probes present where required, and the two vantage points
(probe in-process, agent through /proc) agreeing on what was loaded."""

from __future__ import annotations

from dataclasses import dataclass

from servewitness.model import (
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    EVIDENCE_STDLIB_UNCONFIRMED,
    Finding,
    ProcessReport,
    Severity,
)
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy import probe_errors as PE


@dataclass(frozen=True)
class ViewsAgree:
    """``evidence.disagreement`` when the two vantage points saw different bytes: any manifest
    file the agent re-hashed through /proc/<pid>/root differently from the probe's record (or
    could not see), and the runner file as the probe hashed it in-process against the agent's
    hash now. Always on; silent where either side has no hash for the runner file. A probed
    process the agent did not judge (no provenance in its report) gives
    ``provenance.unjudged`` (PENDING): the probe's record alone never passes."""

    def describe(self) -> str:
        return "in-process and out-of-process evidence agree"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            if p.probe_present and p.provenance is None and p.role not in I.IGNORED_ROLES:
                # Only the probe's word on what this process loaded: never enough for PASS.
                out.append(
                    E.finding(
                        F.PROVENANCE_UNJUDGED,
                        Severity.PENDING,
                        f"the agent has not judged the files of {E.name(p)} from outside the "
                        "process, so only the probe's own record speaks for them",
                        snapshot,
                        **E.base(p),
                        rule=self.describe(),
                    )
                )
            if p.disagreements:
                first = p.disagreements[0]
                out.append(
                    E.finding(
                        F.EVIDENCE_DISAGREEMENT,
                        Severity.ERROR,
                        f"{len(p.disagreements)} file(s) of {E.name(p)} differ between the "
                        f"probe's record and the agent's view through /proc, e.g. {first.path} "
                        f"({first.reason})",
                        snapshot,
                        **E.base(p),
                        count=len(p.disagreements),
                        files=[
                            {
                                "path": d.path,
                                "in_process": d.sha256_in_process,
                                "agent": d.sha256_agent,
                                "reason": d.reason,
                            }
                            for d in p.disagreements[: E.SHOWN]
                        ],
                    )
                )
            r, now = p.runner, p.runner_file_sha256_now
            if r is None or r.sha256 is None or now is None or now == r.sha256:
                continue
            out.append(
                E.finding(
                    F.EVIDENCE_DISAGREEMENT,
                    Severity.ERROR,
                    f"the runner file {r.file} of {E.name(p)} hashed {r.sha256[:12]} in the "
                    f"process when loaded but {now[:12]} through /proc now: it changed after "
                    "load, or the agent does not see the serving container's files",
                    snapshot,
                    **E.base(p),
                    file=r.file,
                    sha256_in_process=r.sha256,
                    sha256_now=now,
                )
            )
        return out


# How each evidence problem reads in a finding ({name}: the process, as E.name says it).
_PROBLEMS = {
    EVIDENCE_JOURNAL_EDITED: "the probe's journal of {name} is not the one the probe wrote",
    # Someone who can write to the probe dir planted it (or it is a dead process's, which
    # garbage collection would have removed): evidence offered for a process that is not the
    # process's is an attack on the verdict, not a gap that more waiting fills.
    EVIDENCE_PROBE_UNBOUND: (
        "probe state found for {name} is not its own and was refused (the process does not "
        "hold its files)"
    ),
    # sys._stdlib_dir is the process's to set: a directory of its own named the standard
    # library would hide a module shadowing the real one's
    EVIDENCE_STDLIB_UNCONFIRMED: "the standard library of {name} is not confirmed",
}


@dataclass(frozen=True)
class EvidenceIntact:
    """Every evidence problem the agent reports (``evidence.journal.edited``,
    ``evidence.probe_state.unbound``) as an ERROR, whatever the process's role: evidence that
    is not what its writer wrote, or not the process's at all, cannot pass, and waiting does
    not make it so. Always on."""

    def describe(self) -> str:
        return "the evidence is what the probe wrote, and the process's own"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            by_id: dict[str, list[str]] = {}
            for x in p.evidence_problems:
                by_id.setdefault(x.id, []).append(x.detail)
            for problem_id, details in by_id.items():
                what = _PROBLEMS.get(problem_id, "the evidence of {name} cannot be trusted")
                more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
                out.append(
                    E.finding(
                        problem_id,
                        Severity.ERROR,
                        f"{what.format(name=E.name(p))}: {details[0]}{more}",
                        snapshot,
                        **E.base(p),
                        problems=details[: E.SHOWN],
                    )
                )
        return out


@dataclass(frozen=True)
class ProbeRequired:
    """``evidence.probe_absent`` for each process of a required role that has no probe;
    ``evidence.probe_state.unbound`` for each process whose name a foreign state directory
    carried (see ``unbound_finding``);
    ``evidence.probe_errors.judged`` (ERROR) for each probe that recorded errors of its own in
    evidence the policy judges, ``evidence.probe_errors`` (a warning) for its other errors;
    ``liveness.steps.raised`` (a warning) for each process whose ``execute_model`` raised.

    ``api_server`` must also be there when the policy names it (EXPLICIT), and under the
    default whenever an ``offline`` front end (vllm.LLM in a script) reported: a target
    without an API server (offline use, a script driving the engine or the executor) then
    gives ``evidence.role_missing`` (PENDING), never a silent pass, since none of its
    requests carries a client's id. A policy for such a target leaves ``api_server`` out of
    require_probe and names the roles it has. A process plays every role in its ``roles``:
    offline use in one process reports as ``worker`` with ``offline`` and ``engine_core``
    among its roles, so it is told apart from a server whose API server is out of view. (The
    hook and runner rules judge the processes that run steps, wherever they are.)"""

    roles: tuple[str, ...] = I.DEFAULT_REQUIRE_PROBE
    explicit: bool = False  # the policy's own [evidence] require_probe, not the default
    hooks: frozenset[str] = frozenset()  # the hooks the policy declares
    files_judged: bool = True  # the policy judges loaded files (runner, files, forbid, pristine)

    def _errors(self, p: ProcessReport, snapshot: I.TargetSnapshot) -> list[Finding]:
        """The probe's own errors in P: those in evidence the policy judges are
        ``evidence.probe_errors.judged`` (ERROR), the rest ``evidence.probe_errors``
        (a warning); see ``policy/probe_errors.py``."""
        yes, no = PE.judged(p.probe_errors, self.hooks, self.files_judged)
        out: list[Finding] = []
        for group, fid, severity, what in (
            (yes, F.EVIDENCE_PROBE_ERRORS_JUDGED, Severity.ERROR, "in evidence the policy judges"),
            (no, F.EVIDENCE_PROBE_ERRORS, Severity.WARNING, "outside what the policy judges"),
        ):
            if not group:
                continue
            first = group[0]
            areas = sorted({e.area for e in group})
            out.append(
                E.finding(
                    fid,
                    severity,
                    f"the probe in {E.name(p)} recorded {len(group)} error(s) of its own "
                    f"{what} ({', '.join(areas)}), so that evidence may be incomplete; the "
                    f"first, in {first.where or 'an untagged place'}: {first.message}",
                    snapshot,
                    **E.base(p),
                    errors=[f"[{e.where}] {e.message}" for e in group[: E.SHOWN]],
                    error_count=len(group),
                    areas=areas,
                    wheres=sorted({e.where for e in group}),
                )
            )
        return out

    def describe(self) -> str:
        return "[evidence] require_probe"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        # every role a process plays: offline use in one process reports as a worker that is
        # also the offline front end (and the engine core)
        present = {r for p in snapshot.processes for r in p.all_roles}
        front = self.explicit or "offline" in present
        if "api_server" in self.roles and front and "api_server" not in present:
            out.append(
                E.finding(
                    F.EVIDENCE_ROLE_MISSING,
                    Severity.PENDING,
                    f"no api_server process is in the report of target {snapshot.target}, and "
                    "[evidence] require_probe names api_server (the default does): offline "
                    "use (vllm.LLM) or a script driving vLLM directly has none, and none of its "
                    "requests carries a client's request id. For such a target, name the roles "
                    'it has, e.g. require_probe = ["engine_core", "worker"]',
                    snapshot,
                    role="api_server",
                    rule=self.describe(),
                    require_probe=list(self.roles),
                    roles_present=sorted(present),
                )
            )
        for p in E.ordered(snapshot.processes):
            if p.role in self.roles and not p.probe_present:
                out.append(
                    E.finding(
                        F.EVIDENCE_PROBE_ABSENT,
                        Severity.ERROR,
                        f"{E.name(p)} has no probe, so what it loaded, its runner and its "
                        "hooks are unknown",
                        snapshot,
                        **E.base(p),
                        require_probe=list(self.roles),
                    )
                )
            elif p.probe_present and p.probe_errors and p.role not in I.IGNORED_ROLES:
                out.extend(self._errors(p, snapshot))
            raised = p.steps.raised if p.steps is not None else 0
            if raised and p.role not in I.IGNORED_ROLES:
                out.append(
                    E.finding(
                        F.STEPS_RAISED,
                        Severity.WARNING,
                        f"{raised} execute_model call(s) raised in {E.name(p)} and are not "
                        "counted as steps: a driver that calls execute_model again before "
                        "sample_tokens, or expects its output where the two-phase protocol "
                        "returns none, gets this",
                        snapshot,
                        **E.base(p),
                        raised=raised,
                    )
                )
        return out


_NATIVE = {
    "replaced": (
        F.NATIVE_REPLACED,
        Severity.ERROR,
        "now holds other bytes than the inode it mapped",
    ),
    "deleted": (F.NATIVE_DELETED, Severity.ERROR, "was deleted from disk while mapped"),
    "unreadable": (F.NATIVE_UNREADABLE, Severity.WARNING, "could not be read as mapped"),
    "changed": (
        F.NATIVE_CHANGED_IN_PLACE,
        Severity.ERROR,
        "was rewritten in place (the same inode) while mapped",
    ),
    "memory": (
        F.NATIVE_FROM_MEMORY,
        Severity.ERROR,
        "was loaded from memory (a memfd), no file on any disk",
    ),
}


@dataclass(frozen=True)
class NativeIntact:
    """One finding per process and state for native mappings that are not ``same``: the
    path replaced or deleted under a live mapping, the mapped inode rewritten in place, or a
    mapping the agent could not read."""

    def describe(self) -> str:
        return "native mappings intact"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        out: list[Finding] = []
        for p in E.ordered(snapshot.processes):
            for state, (fid, severity, what) in _NATIVE.items():
                hits = [n for n in p.native_mappings if n.state == state]
                if not hits:
                    continue
                out.append(
                    E.finding(
                        fid,
                        severity,
                        f"{len(hits)} native librar{'y' if len(hits) == 1 else 'ies'} of "
                        f"{E.name(p)} {what}, e.g. {hits[0].path}"
                        + (f" ({hits[0].detail})" if hits[0].detail else ""),
                        snapshot,
                        **E.base(p),
                        count=len(hits),
                        mappings=[
                            {"path": n.path, "sha256": n.sha256, "error": n.error}
                            | ({"detail": n.detail} if n.detail else {})
                            for n in hits[: E.SHOWN]
                        ],
                    )
                )
        return out
