"""What one collect of the agent reports, as parts: one report's processes and what goes with
them. Usually one part, the agent's target. With ``--instance-per-container`` one part per
container that runs vLLM processes, each as the instance ``TARGET/<its 12-hex id>``: N serving
containers in one PID namespace (a compose service scaled to N under one holder) are N
targets, each judged on its own processes, instead of one ``evidence.target.mixed`` target."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from servewitness.agent.trees import TreeMemory
from servewitness.evidence.process import ProcessEvidence
from servewitness.instances import instance_of
from servewitness.model import ProcessKey, ProcessReport, RequestId, RequestSpan


def files_once(procs: Iterable[ProcessReport]) -> tuple[ProcessReport, ...]:
    """PROCS with each manifest's files carried once: a process whose manifest digest an
    earlier one in the same report carries with its files is sent with its digest only (the
    verifier takes a digest's files from the first process that has them). Processes that
    load the same code (tensor-parallel workers) then cost the report's files budget
    (``files_per_report``, servewitness/wire/limits.py) once, not once each."""
    carried: set[str] = set()
    out: list[ProcessReport] = []
    for p in procs:
        digest = p.manifest_digest
        if p.files is not None and digest and digest in carried:
            out.append(dataclasses.replace(p, files=None))
            continue
        if p.files is not None and digest:
            carried.add(digest)
        out.append(p)
    return tuple(out)


@dataclass(frozen=True)
class Part:
    """What one report of a collect carries: its target's processes and what went with them."""

    target: str
    procs: list[ProcessReport]
    gone: tuple[ProcessKey, ...]
    unobservable: tuple[str, ...]
    mixed: tuple[ProcessKey, ...]
    spans: tuple[RequestSpan, ...]
    request_ids: tuple[RequestId, ...]


@dataclass
class Split:
    """Splits a collect by container (as each process's report placed it): TARGET the family,
    TREES the trees seen per container (kept by the agent across collects), NOTHING_VISIBLE
    why no vLLM process is visible at all."""

    target: str
    trees: dict[str, TreeMemory]
    nothing_visible: Callable[[], str]

    def parts(
        self,
        found: list[ProcessEvidence],
        procs: list[ProcessReport],
        was: dict[ProcessKey, str | None],
        refused: list[str],
        bindings: tuple[tuple[RequestSpan, ...], tuple[RequestId, ...]],
    ) -> list[Part]:
        """One collect's processes as one part per container (``--instance-per-container``);
        processes outside any container under the plain target. A container whose processes
        all exited since the last collect gets one part that says so (they are gone)."""
        spans, request_ids = bindings
        where = {p.key: p.container_id for p in procs}
        ids = sorted({c or "" for c in [*where.values(), *was.values()]})
        # each process's container as its report read it (not the cgroup read again)
        placed = {(k.pid, k.start_ticks): c for k, c in where.items()}
        evidence: dict[str, list[ProcessEvidence]] = {}
        for ev in found:
            cid = placed.get((ev.identity.pid, ev.identity.start_ticks))
            evidence.setdefault(cid or "", []).append(ev)
        out = []
        for cid in ids:
            mine = [p for p in procs if (p.container_id or "") == cid]
            gone = tuple(k for k, c in was.items() if (c or "") == cid)
            trees = self.trees.setdefault(cid, TreeMemory(selected=False))
            mixed = trees.observe(evidence.get(cid, []))
            if not mine:
                self.trees.pop(cid, None)
            pids = ", ".join(str(k.pid) for k in gone)
            unobservable = (
                tuple(refused)
                if mine
                else (f"no vLLM process is visible in this container: pid {pids} exited",)
            )
            target = instance_of(self.target, cid[:12]) if cid else self.target
            in_it = {p.key for p in mine}
            out.append(Part(
                target, mine, gone, unobservable, mixed,
                tuple(s for s in spans if s.process in in_it),
                tuple(r for r in request_ids if r.process in in_it),
            ))  # fmt: skip
        if not out:  # nothing visible at all: the plain target says why
            out.append(Part(self.target, [], (), (self.nothing_visible(),), (), (), ()))
        return out
