"""``[provenance] all_code_claimed``: every code file a judged process ran is vouched for by
someone; ``[provenance] only_distributions``: and by no installer the policy did not name.

``[provenance] pristine`` pins the distributions it lists and says nothing about the rest: a
``sitecustomize.py`` on ``PYTHONPATH``, a module in no distribution, a patched file of a
dependency the policy does not list, or ``python -c`` code can change a pristine vLLM in
memory after it loaded, and every file the policy judges is still pristine. Code patched in
memory cannot be seen file by file (docs/threat-model.md), but the code that patches it is
itself a file the process ran, and that file is one of these. So this rule asks the other
question: is every file that ran claimed?

A file is claimed when it is pristine (its RECORD's bytes, any distribution), the standard
library's, a ``[[patches]]`` entry of a distribution with exactly those bytes, a
``[[claims]]`` entry (a path and its sha256: the user vouches for those bytes), generated at
run time under the process's compile caches (accepted, listed in an INFO finding: what a
cache held before the start is not pinned, docs/threat-model.md says so), or the stub by
which ``multiprocessing`` starts a spawned interpreter (``-c 'from multiprocessing.spawn
import spawn_main; spawn_main(...)'`` with numbers only). A pyc counts as its source when the
source is claimed and no drift finding names the pyc (the agent compares every pyc with its
source). Files of a ``pristine`` distribution are ``Pristine``'s to judge and are skipped.

Both rules read only what the agent judged from outside (``ProcessReport.provenance``, where
``-c`` code is listed as an ``unknown`` file of path ``-c``, and the command line it read):
the verifier keeps no manifest in a report it judges. A process whose provenance is not
judged yet is the ``provenance.unjudged`` (PENDING) of ``ViewsAgree``, never a pass here.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servewitness.model import FileOrigin, Finding, Origin, ProcessReport, Provenance, Severity
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy.vouch import Claim, Patch, vouched

INLINE_PATH = "-c"  # the path of ``-c`` code (a manifest entry of kind inline)
_PYC = re.compile(r"(?P<dir>.*)/__pycache__/(?P<name>[^./]+)\.[^./]+(?:\.opt-\d+)?\.pyc")
# multiprocessing's spawn start method runs ``-c`` code of two statements: an import of its
# entry function and one call of it with literal arguments (``spawn.get_command_line``). The
# forkserver's is not taken: its literal arguments name a main script to run by path.
_STUBS = frozenset({("multiprocessing.spawn", "spawn_main")})
_MAX_STUB = 4096
# The order unclaimed files are listed in: code from nowhere first, an editable checkout last.
_FIRST: dict[str, int] = {"unknown": 1, "patched": 2, "added": 3, "editable": 5}


def source_of(pyc: str) -> str | None:
    """``<dir>/__pycache__/<name>.<tag>.pyc`` -> ``<dir>/<name>.py``; None otherwise."""
    m = _PYC.fullmatch(pyc)
    return None if m is None else f"{m['dir']}/{m['name']}.py"


def spawn_stub(cmdline: tuple[str, ...], sha256: str | None) -> bool:
    """Whether the ``-c`` code of CMDLINE is multiprocessing's start stub and has SHA256
    (the probe's hash of the code it ran: the agent checks it against ``/proc``)."""
    try:
        code = cmdline[cmdline.index("-c") + 1]
    except (ValueError, IndexError):
        return False
    if len(code) > _MAX_STUB or not _is_stub(code):
        return False
    return sha256 is not None and hashlib.sha256(code.encode()).hexdigest() == sha256.lower()


def _is_stub(code: str) -> bool:
    """Whether CODE is exactly ``from multiprocessing.<m> import <f>; <f>(<literals>)``: no
    other statement, and no argument that is not a literal (a call in one would run code)."""
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if len(body) != 2:
        return False
    imp, stmt = body
    fn = imp.names[0] if isinstance(imp, ast.ImportFrom) and len(imp.names) == 1 else None
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if (
        fn is None
        or not isinstance(imp, ast.ImportFrom)
        or imp.level
        or (imp.module, fn.name) not in _STUBS
        or fn.asname is not None
        or not isinstance(call, ast.Call)
        or not isinstance(call.func, ast.Name)
        or call.func.id != fn.name
    ):
        return False
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        try:
            ast.literal_eval(arg)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return False
    return True


@dataclass(frozen=True)
class _Accepted:
    how: str  # generated | claimed | patch | [spawn stub, ]started by <parent>
    path: str
    note: str = ""


@dataclass(frozen=True)
class AllCodeClaimed:
    """Every code file a judged process ran is claimed (module docstring): else one
    ``provenance.code.unclaimed`` (ERROR) per process naming the files; what was accepted
    beyond pristine and stdlib is ``provenance.code.claimed`` (INFO), per process."""

    pristine: tuple[str, ...] = ()  # canonical names: Pristine judges their files
    patches: tuple[Patch, ...] = ()
    claims: tuple[Claim, ...] = ()

    def describe(self) -> str:
        return "[provenance] all_code_claimed"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.any_main(snapshot, ctx, self.describe())
        judged = {(q.key.boot_id, q.key.pid): q for q in E.probed(procs)}
        for p in E.probed(procs):
            if p.provenance is None:
                continue  # ViewsAgree reports it (provenance.unjudged, PENDING)
            unclaimed, accepted = self._judge(p, p.provenance)
            parent = judged.get((p.key.boot_id, p.ppid))
            unclaimed, more = _started_by(p, parent, unclaimed)
            accepted += more
            if unclaimed:
                out.append(
                    E.finding(
                        F.CODE_UNCLAIMED,
                        Severity.ERROR,
                        f"{E.name(p)} ran {len(unclaimed)} code file"
                        f"{'' if len(unclaimed) == 1 else 's'} nobody claims, e.g. "
                        f"{unclaimed[0]['path']}: {unclaimed[0]['why']}",
                        snapshot,
                        **E.base(p),
                        count=len(unclaimed),
                        entries=unclaimed[: E.SHOWN],
                    )
                )
            if accepted:
                kinds: dict[str, int] = {}
                for a in accepted:
                    kind = "started by its parent" if "started by" in a.how else a.how
                    kinds[kind] = kinds.get(kind, 0) + 1
                out.append(
                    E.finding(
                        F.CODE_CLAIMED,
                        Severity.INFO,
                        f"{E.name(p)}: beyond pristine and stdlib files, accepted "
                        + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())),
                        snapshot,
                        **E.base(p),
                        counts=kinds,
                        entries=[
                            {"path": a.path, "how": a.how, "note": a.note}
                            for a in accepted[: E.SHOWN * 5]
                        ],
                    )
                )
        return out

    def unclaimed(self, processes: Sequence[ProcessReport]) -> list[dict[str, Any]]:
        """Every file this rule leaves unclaimed in PROCESSES' judged ones (``verifier policy
        init --claim-all-code`` writes a claim for each), each with its process's pid."""
        judged = [p for p in processes if p.probe_present and p.role not in I.IGNORED_ROLES]
        by_key = {(q.key.boot_id, q.key.pid): q for q in judged}
        out: list[dict[str, Any]] = []
        for p in judged:
            if p.provenance is not None:
                left, _ = self._judge(p, p.provenance)
                left, _ = _started_by(p, by_key.get((p.key.boot_id, p.ppid)), left)
                out += [{**e, "pid": p.key.pid, "role": p.role} for e in left]
        return out

    def _judge(
        self, p: ProcessReport, prov: Provenance
    ) -> tuple[list[dict[str, Any]], list[_Accepted]]:
        unclaimed: list[dict[str, Any]] = []
        accepted: list[_Accepted] = []
        expected = sum(n for o, n in prov.counts if o not in (Origin.PRISTINE, Origin.STDLIB))
        if len(prov.files) < expected:
            unclaimed.append(
                {
                    "path": None,
                    "why": f"the report lists {len(prov.files)} of the {expected} files that "
                    "are not pristine or stdlib: the rest cannot be judged",
                }
            )
        flagged = {d.path for d in p.drift}
        by_path = {f.path: f for f in prov.files}
        for f in prov.files:
            if f.distribution in self.pristine:
                continue
            if f.path == INLINE_PATH:
                how, why = self._inline(p, f)
            else:
                how, why = self._file(f, by_path, flagged)
            if why is None:
                accepted.append(_Accepted(how, f.path))
            else:
                unclaimed.append(
                    {
                        "path": f.path,
                        "origin": f.origin,
                        "sha256": f.sha256,
                        "distribution": f.distribution,
                        "record_path": f.record_path,
                        "why": why,
                    }
                )
        unclaimed.sort(
            key=lambda e: (e["path"] != INLINE_PATH, _FIRST.get(e.get("origin") or "", 9))
        )
        return unclaimed, accepted

    def _inline(self, p: ProcessReport, f: FileOrigin) -> tuple[str, str | None]:
        """``-c`` code: claimed by its bytes here; multiprocessing's start stub only with the
        judged parent that started it (``_started_by``)."""
        claim = next((c for c in self.claims if c.covers(INLINE_PATH)), None)
        if claim is not None and claim.sha256 == (f.sha256 or "").lower():
            return "claimed", None
        return "", (
            "code given on the command line (python -c) that no [[claims]] entry vouches for"
        )

    def _file(
        self, f: FileOrigin, by_path: dict[str, FileOrigin], flagged: set[str]
    ) -> tuple[str, str | None]:
        """(how it was accepted, None) or ("", why it is not claimed)."""
        claims = [c for c in self.claims if c.covers(f.path)]
        how = vouched(f, self.claims, self.patches)
        if how is not None:
            return how, None
        if claims:
            return (
                "",
                f"its [[claims]] entry has sha256 {E.short_sha(claims[0].sha256)}, it ran "
                f"{E.short_sha(f.sha256)}",
            )
        if f.origin == Origin.GENERATED:
            return "generated", None
        source = source_of(f.path)
        if source is not None and f.path not in flagged:
            src = by_path.get(source)
            if src is not None and self._file(src, by_path, flagged)[1] is None:
                return "claimed", None  # its source claimed, and the agent saw no drift in it
        owner = f" of {f.distribution}" if f.distribution else ""
        return "", f"{f.origin}{owner}: {f.reason}"


def _started_by(
    p: ProcessReport, parent: ProcessReport | None, unclaimed: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[_Accepted]]:
    """``-c`` code of a process that a judged process of the target started, and that is
    multiprocessing's start stub as the agent read it from ``/proc/<pid>/cmdline``, or that
    the agent could not read because the process wrote its title over its command line (as
    vLLM's engine and workers do): the parent's code, judged here too, chose it. The stub
    alone is not enough: ``spawn_main`` unpickles what the pipe it names carries, code that
    only the process on the other end chose. Otherwise the code stays unclaimed.

    "Started by" is not the kernel's parent pid, which says nothing of who made the child: a
    process keeps its pid and start time across ``exec`` (a child a shell forked just before
    it ``exec``ed the judged server is the server's child), and a sibling's
    ``clone(CLONE_PARENT)`` makes the server a child's parent. It is the parent's probe
    having journaled the child as started by its code (``ProcessReport.children``: the
    child's pid in that namespace and its start ticks), after the probe started
    (``probe_started_ticks``). A parent whose children are not known starts none."""
    if parent is None or parent.probe_started_ticks is None or parent.children is None:
        return unclaimed, []
    if p.key.start_ticks <= parent.probe_started_ticks:
        return unclaimed, []
    if (p.ns_pid, p.key.start_ticks) not in set(parent.children):
        return unclaimed, []
    inline = [e for e in unclaimed if e["path"] == INLINE_PATH]
    if not inline:
        return unclaimed, []
    rewritten = "-c" not in p.cmdline
    if not rewritten and not spawn_stub(p.cmdline, inline[0].get("sha256")):
        return unclaimed, []
    how = f"{'' if rewritten else 'spawn stub, '}started by {E.name(parent)}"
    keep = [e for e in unclaimed if e["path"] != INLINE_PATH]
    return keep, [_Accepted(how, INLINE_PATH) for _ in inline]


@dataclass(frozen=True)
class OnlyDistributions:
    """``[provenance] only_distributions``: no judged process loads a file of a distribution
    the list does not name (``provenance.distribution.unlisted``, ERROR): a whole package
    installed with its own RECORD (a plugin registered through ``vllm.general_plugins``, a
    ``.pth`` its RECORD lists) is pristine, and would otherwise be claimed."""

    names: tuple[str, ...]  # canonical

    def describe(self) -> str:
        return f"[provenance] only_distributions = {list(self.names)}"

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.any_main(snapshot, ctx, self.describe())
        for p in E.probed(procs):
            if p.provenance is None:
                continue  # ViewsAgree reports it (provenance.unjudged, PENDING)
            extra = [(d, v, n) for d, v, n in p.provenance.distributions if d not in self.names]
            if extra:
                out.append(
                    E.finding(
                        F.DISTRIBUTION_UNLISTED,
                        Severity.ERROR,
                        f"{E.name(p)} loaded files of "
                        + ", ".join(f"{d} {v} ({n} files)" for d, v, n in extra[: E.SHOWN])
                        + ", which [provenance] only_distributions does not name",
                        snapshot,
                        **E.base(p),
                        distributions=[{"name": d, "version": v, "files": n} for d, v, n in extra],
                    )
                )
        return out
