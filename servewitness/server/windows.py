"""Measurement windows the verifier opens and seals itself (``OpenWindow``, ``SealWindow``).

Open: the run must PASS on evidence every target reported *after the call arrived*, judged on
the verifier's age clock (``server/clock.py``: it cannot be stepped back, and no client's clock
enters); the verifier waits up to the caller's timeout for it, refuses at once on a FAIL on
such evidence, and otherwise refuses when the timeout passes. On PASS it records a ``window``
ledger entry: a random id, the run, the policy digest, when, the ledger's size, the unsafe
policy flags, for every process of every target the report it rests on (agent id, report
seq and that report's ledger entry) with its identity, step counts and hook counts, and the
verifier's boot id and boot clock (``verifier_clock``).

Seal: waits the same way for every target to report after the seal began, judges the window
from the reports stored at each end (the same processes, each process that runs steps
stepped, every hook kept pace: ``policy/window.py``, ``policy/window_ends.py``) and from the
verifier's clocks at each end (not sealed before it opened, the wall clock not stepped in
between: ``elapsed`` in the seal), records a
``seal`` ledger entry (a broken window too: held false, so a failure cannot be hidden by not
sealing), signs a checkpoint covering it and returns the signed seal document
(``ledger/seal.py``). A window is sealed once; another run's window is refused.

Windows live in the database: one opened before a verifier restart can be sealed after it
(its counts at open are in its ledgered content; the seal waits for evidence reported to the
restarted verifier, so nothing from before the restart counts as the window's end).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from servewitness import wire
from servewitness.model import ProcessKey, RunVerdict, Verdict
from servewitness.policy import Policy, unsafe_flags
from servewitness.policy import window as pw
from servewitness.policy import window_ends as pe
from servewitness.policy.findings import POLICY_REFUSED
from servewitness.server import clock
from servewitness.server.evaluate import Evaluator, Tracked
from servewitness.server.store import RunRecord, Store, UnknownRun
from servewitness.server.window_errors import WindowError

if TYPE_CHECKING:
    from servewitness.ledger.keys import Ed25519PrivateKey
    from servewitness.server.window_rows import StoredWindow

log = structlog.get_logger("verifier.serve")
POLL_S = 0.1
MAX_TIMEOUT_S = 3600.0
# At most this many open/seal calls wait at once by default: each holds a server worker while
# it waits, and the agents' reports need workers too (app.py passes half its workers).
MAX_WAITING = 4

PROBE_ERRORS_SHOWN = 10  # per process in a seal's evidence; the count says how many
# How long after a request finishes its binding may take to reach a report: the probe writes
# bindings every 0.5 s (``_bindings.FLUSH_INTERVAL_S``), then the agent reads them.
BINDINGS_GRACE_S = 2.0
# The bindings of the requests not served yet are read again at most this often while a seal
# waits (100,000 ids cost about a second each time; a fleet's reports arrive every poll).
REQUESTS_REREAD_S = 1.0


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Judged:
    run: RunRecord
    verdict: RunVerdict
    tracked: dict[str, Tracked]
    fresh: bool  # every judged target reported after the call arrived

    @property
    def unjudged(self) -> bool:
        """The run's policy is refused (``policy.refused``: it does not load, or its stored
        text is not the one registered): FAIL, and no evidence can change that."""
        return self.verdict.verdict == Verdict.FAIL and any(
            f.id == POLICY_REFUSED for f in self.verdict.findings
        )


class Windows:
    def __init__(
        self,
        store: Store,
        evaluator: Evaluator,
        key: Ed25519PrivateKey | None,
        on_checkpoint: Callable[[int], None] | None = None,
        max_waiting: int = MAX_WAITING,
    ) -> None:
        self.store = store
        self.max_waiting = max_waiting
        self._waiting = threading.BoundedSemaphore(max_waiting)
        self.evaluator = evaluator
        self.key = key
        self.on_checkpoint = on_checkpoint
        self._lock = threading.Lock()
        self._sealing: set[str] = set()

    # judging -------------------------------------------------------------------------------
    def _judge(self, name: str, since_boot_s: float) -> Judged:
        try:
            run = self.store.get_run(name)
        except UnknownRun as e:
            raise WindowError("not_found", e.explain()) from None
        if run is None:  # get_run raises UnknownRun; this only narrows the type
            raise WindowError("not_found", f"no run named {name!r}")
        tracked = {t.snapshot.target: t for t in self.evaluator.targets() if not t.expired}
        snaps = [tracked[t].snapshot for t in sorted(tracked)]
        verdict = self.evaluator.run_verdict(run, time.time(), snaps)
        fresh = bool(verdict.targets) and all(
            (at := tracked[t.target].snapshot.evidence_boot_s) is not None and at > since_boot_s
            for t in verdict.targets
            if t.target in tracked
        )
        return Judged(run, verdict, tracked, fresh)

    def _wait(
        self,
        name: str,
        timeout_s: float,
        *,
        decided: bool,
        active: Callable[[], bool],
        settle: Callable[[Judged, float], bool] | None = None,
    ) -> Judged:
        """Judge NAME until every target reported after now (or TIMEOUT_S passed). DECIDED:
        and until the verdict on that evidence is PASS or FAIL (an open waits out PENDING; a
        seal takes the first verdict on fresh evidence, whatever it is). SETTLE: and until it
        says so of the judgement (given when the wait began, on the age clock). A worker waits here:
        at most ``max_waiting`` calls at once (``busy`` beyond), and none after its caller
        went away (ACTIVE false: ``cancelled``), so waiting calls cannot starve the agents."""
        if not self._waiting.acquire(blocking=False):
            raise WindowError(
                "busy",
                f"{self.max_waiting} window calls are waiting already (each holds a server "
                "worker): try again when one is done",
            )
        try:
            since = clock.boot_s()
            deadline = time.monotonic() + min(timeout_s, MAX_TIMEOUT_S)
            while True:
                j = self._judge(name, since)
                final = j.verdict.verdict in (Verdict.PASS, Verdict.FAIL)
                if j.fresh and (final or not decided) and (settle is None or settle(j, since)):
                    return j
                if j.unjudged:  # no evidence can change it: said now, not at the timeout
                    return j
                if time.monotonic() >= deadline:
                    return j
                if not active():
                    raise WindowError("cancelled", "the caller went away while it waited")
                time.sleep(POLL_S)
        finally:
            self._waiting.release()

    def _evidence(self, j: Judged, now_boot_s: float) -> list[dict[str, Any]]:
        """Per process of every judged target: the report it rests on and how it stood."""
        out: list[dict[str, Any]] = []
        for t in j.verdict.targets:
            tr = j.tracked.get(t.target)
            if tr is None:
                continue
            entry = self.store.report_entry(tr.agent_id, tr.seq)
            snap = tr.snapshot
            at = snap.evidence_boot_s
            stepping = pe.runs_steps(snap.processes)
            for p in snap.processes:
                out.append(
                    {
                        "target": t.target,
                        "agent_id": tr.agent_id,
                        "report_seq": tr.seq,
                        "ledger_seq": None if entry is None else entry[0],
                        "entry_hash": None if entry is None else entry[1],
                        "boot_id": p.key.boot_id,
                        "pid": p.key.pid,
                        "start_ticks": p.key.start_ticks,
                        "role": p.role,
                        "rank": p.rank,
                        "manifest_digest": p.manifest_digest,
                        # engine steps at this report (a request bound to a later step ran
                        # after it: the seal's requests check); None where no steps are counted
                        "steps_total": None if p.steps is None else p.steps.total,
                        # productive steps, and whether the window counts them in this process
                        # (``window_ends.progress``: each process that runs steps must step)
                        "steps_productive": None if p.steps is None else p.steps.productive,
                        "runs_steps": p.key in stepping,
                        "authenticated_as": snap.authenticated_as,
                        "evidence_age_s": None if at is None else round(now_boot_s - at, 6),
                        "target_verdict": t.verdict.value,
                        # the probe's own errors stand in the seal (a held one too): what the
                        # process's evidence may lack is never left out of what a seal shows
                        "probe_errors": list(p.probe_errors[:PROBE_ERRORS_SHOWN]),
                        "probe_error_count": len(p.probe_errors),
                    }
                )
        return out

    @staticmethod
    def _keys(j: Judged) -> dict[tuple[str, int], ProcessKey]:
        return {
            (name, p.key.pid): p.key for name, t in j.tracked.items() for p in t.snapshot.processes
        }

    def _unsafe(self, run: RunRecord) -> list[str]:
        pol = self.evaluator.policy(run)
        return list(unsafe_flags(pol)) if isinstance(pol, Policy) else []

    # open ----------------------------------------------------------------------------------
    def open(
        self, req: wire.WindowOpening, active: Callable[[], bool] = _always
    ) -> wire.OpenedWindow:
        j = self._wait(req.run, req.timeout_s, decided=True, active=active)
        v = j.verdict
        if v.verdict != Verdict.PASS or not j.fresh:
            why = f"run {req.run} is {v.verdict.value}: {pw.top_finding(v)}"
            if v.verdict == Verdict.FAIL and (j.fresh or j.unjudged):
                raise WindowError("refused", f"window refused: {why}")
            raise WindowError(
                "timeout",
                f"window refused: timed out after {req.timeout_s:g} s without a PASS on "
                f"evidence every target reported after the call arrived; {why}"
                + ("" if j.fresh else " (some target has not reported since)"),
            )
        wid = secrets.token_hex(16)
        opened = time.time()
        content: dict[str, Any] = {
            "window_id": wid,
            "run": j.run.name,
            "policy_digest": j.run.policy_digest,
            "opened_unix": opened,
            "verdict": v.verdict.value,
            "unsafe_flags": self._unsafe(j.run),
            "evidence": self._evidence(j, clock.boot_s()),
            "hooks": pw.hook_rows(v, self._keys(j)),
            "verifier_clock": verifier_clock(),
        }
        entry, _ = self.store.record_window(wid, j.run.name, opened, content)
        log.info("window_opened", run=j.run.name, window=wid, ledger_seq=entry.seq)
        digest = j.run.policy_digest
        return wire.OpenedWindow(wid, j.run.name, digest, opened, entry.seq, entry.hash)

    # seal ----------------------------------------------------------------------------------
    def seal(
        self, req: wire.WindowSealing, active: Callable[[], bool] = _always
    ) -> wire.SealedWindow:
        if self.key is None:
            raise WindowError("refused", "this verifier has no signing key: it cannot seal")
        w = self.store.get_window(req.window_id)
        if w is None:
            raise WindowError("not_found", f"no window {req.window_id!r} on this verifier")
        if w.run != req.run:
            raise WindowError(
                "invalid", f"window {req.window_id} is a window on run {w.run}, not {req.run}"
            )
        if w.edited:
            raise WindowError(
                "refused",
                f"window {req.window_id}'s stored opening is not what its ledger entry "
                f"{w.entry.seq} records (the database was edited): it cannot be sealed; "
                "open another window",
            )
        with self._lock:
            if w.sealed or req.window_id in self._sealing:
                raise WindowError("exists", f"window {req.window_id} is already sealed")
            self._sealing.add(req.window_id)
        try:
            return self._seal(req, w, active)
        finally:
            with self._lock:
                self._sealing.discard(req.window_id)

    def _seal(
        self, req: wire.WindowSealing, w: StoredWindow, active: Callable[[], bool]
    ) -> wire.SealedWindow:
        key = self.key
        if key is None:  # checked by seal(); narrows the type
            raise WindowError("refused", "this verifier has no signing key: it cannot seal")
        from servewitness.ledger import seal as sealdoc
        from servewitness.ledger.keys import key_id
        from servewitness.server.window_rows import AlreadySealed

        opened = json.loads(w.content_json)
        served = RequestWait(self.store, req.request_ids, opened_processes(opened))
        settle = served.settled if req.request_ids else None
        j = self._wait(req.run, req.timeout_s, decided=False, active=active, settle=settle)
        evidence = self._evidence(j, clock.boot_s())
        # the processes first: the hook rows of one that changed are not compared
        changed = pe.same_processes(opened["evidence"], evidence)
        tags = pe.changed_tags(changed)
        ends = pe.without(pw.hook_rows(j.verdict, self._keys(j)), tags)
        rows, found = pw.pace(pe.without(opened["hooks"], tags), ends)
        found = [
            *changed,
            *pe.unledgered(opened["evidence"], evidence),
            *(pe.progress(opened["evidence"], evidence, rows) or []),
            *found,
        ]
        requests: dict[str, Any] | None = None  # not checked: the harness named no requests
        if req.request_ids:
            requests, unserved = served.judged(j)
            if unserved is not None:
                found.append(unserved)
        if not j.fresh:
            found.insert(
                0,
                pw.WindowFinding(
                    pw.WINDOW_NO_FRESH_EVIDENCE,
                    f"no report from every target arrived within {req.timeout_s:g} s after the "
                    "seal began: nothing shows the processes at the window's end",
                    {"timeout_s": req.timeout_s},
                ),
            )
        sealed = time.time()
        at_seal = verifier_clock()
        span, wrong = pe.elapsed(
            opened["opened_unix"], sealed, opened.get("verifier_clock"), at_seal
        )
        found[:0] = wrong
        np = pw.not_pass(req.run, j.verdict)
        if np is not None:
            found.insert(0, np)
        content: dict[str, Any] = {
            "window_id": req.window_id,
            "run": req.run,
            "policy_digest": j.run.policy_digest,
            "opened_unix": opened["opened_unix"],
            "sealed_unix": sealed,
            "open_entry": {"seq": w.entry.seq, "hash": w.entry.hash},
            "results": {
                "name": req.results_name,
                "sha256": req.results_sha256,
                "size": req.results_size,
            },
            "verifier_key_id": key_id(key),
            "verdict_at_open": opened["verdict"],
            "verdict_at_seal": j.verdict.verdict.value,
            "held": not found,
            "findings": pw.findings_json(found),
            "hooks": rows,
            "evidence": evidence,
            "unsafe_flags": self._unsafe(j.run),
            "requests": requests,
            # the verifier's boot clock at the seal, and the window's length on both clocks
            # (its boot clock's only when the open recorded one of the same boot)
            "verifier_clock": at_seal,
            "elapsed": span,
        }
        try:
            entry, _ = self.store.record_seal(req.window_id, req.run, sealed, content)
        except AlreadySealed as e:
            raise WindowError("exists", str(e)) from None
        cp = self.store.sign_checkpoint(key)
        if cp is not None and self.on_checkpoint is not None:
            self.on_checkpoint(cp.size)
        proofs = self.store.seal_proofs(key, w.entry.seq, entry.seq)
        if proofs is None:
            raise WindowError("refused", "no signed checkpoint covers the seal entry")
        env = sealdoc.envelope(key, opened, content, w.entry, entry)
        doc = sealdoc.document(
            env,
            proofs.note,
            (w.entry, entry),
            (proofs.open_proof, proofs.seal_proof),
            proofs.consistency,
        )
        log.info(
            "window_sealed",
            run=req.run,
            window=req.window_id,
            held=not found,
            findings=[f.id for f in found],
            ledger_seq=entry.seq,
        )
        return wire.SealedWindow(not found, sealdoc.dump(doc))


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")  # the running kernel's, in any container


def verifier_clock() -> dict[str, Any]:
    """This verifier's clocks now, as a window's content records them at each end: its host's
    boot id (None where it cannot be read: not Linux) and its age clock (``server/clock.py``).
    Two readings of one boot differ by the true time between them, whatever the wall clock
    did; a window's seal relates them (``window_ends.elapsed``)."""
    try:
        boot: str | None = BOOT_ID.read_text().strip() or None
    except OSError:
        boot = None
    return pe.verifier_clock(boot, clock.boot_s(), clock.NAME)


def opened_processes(opened: dict[str, Any]) -> dict[pw.ProcessAt, int | None]:
    """The processes a window's open content judged, with their step counts at the open
    (None: not counted, or a window opened by a verifier that did not record them)."""
    out: dict[pw.ProcessAt, int | None] = {}
    for r in opened.get("evidence", ()):
        steps = r.get("steps_total")
        out[(r["target"], r["boot_id"], r["pid"], r["start_ticks"])] = (
            steps if isinstance(steps, int) else None
        )
    return out


class RequestWait:
    """The seal's wait for the harness's requests to show up as bindings. The probe writes a
    finished request's binding within ``BINDINGS_GRACE_S`` and the agent reports it on its next
    round, so the seal waits (within its timeout) until every request is served or every
    target reported evidence read that long after the seal began. The bindings of the requests
    not served yet are read again only after a new report of one of the window's targets,
    and at most every ``REQUESTS_REREAD_S``."""

    def __init__(
        self, store: Store, ids: tuple[str, ...], at_open: dict[pw.ProcessAt, int | None]
    ) -> None:
        self.store = store
        self.ids = ids
        self.at_open = at_open
        self.where: dict[str, list[tuple[str, str, int, int, int]]] = {}
        self._served: set[str] = set()
        self.refused: set[str] = set()  # batches whose rows no ledger entry covers: ignored
        self._seen: frozenset[tuple[str, int]] | None = None  # the reports read last time
        self._last = -REQUESTS_REREAD_S  # when (monotonic) the bindings were read last

    def _read(self, j: Judged, *, last: bool = False) -> None:
        """Read the bindings of the requests not served yet, if a report of the window's
        targets came since the last read and (unless LAST: the judgement's own read) that
        was at least ``REQUESTS_REREAD_S`` ago."""
        mine = {p[0] for p in self.at_open}
        seen = frozenset((t, tr.seq) for t, tr in j.tracked.items() if t in mine)
        now = time.monotonic()
        if seen == self._seen or (not last and now - self._last < REQUESTS_REREAD_S):
            return
        self._seen, self._last = seen, now
        missing = [i for i in self.ids if i not in self._served]
        for rid, rows in self.store.request_steps(missing, self.refused).items():
            self.where[rid] = rows
            if pw.is_served(rows, self.at_open):
                self._served.add(rid)

    def settled(self, j: Judged, since_boot_s: float) -> bool:
        self._read(j)
        if len(self._served) == len(self.ids):
            return True
        late = since_boot_s + BINDINGS_GRACE_S
        return all(
            (at := tr.snapshot.evidence_boot_s) is not None and at >= late
            for t, tr in j.tracked.items()
            if any(p[0] == t for p in self.at_open)
        )

    def judged(self, j: Judged) -> tuple[dict[str, Any], pw.WindowFinding | None]:
        """The seal's ``requests`` summary and finding, on every report J holds."""
        self._read(j, last=True)
        summary, finding = pw.requests_served(self.ids, self.where, self.at_open)
        if finding is not None and self.refused:
            # Rows outside their batch's ledgered digest (or of a batch with no entry) were
            # read and not counted: say so, a database edited behind the ledger's back.
            shown = sorted(self.refused)[: pw.UNSERVED_SHOWN]
            finding = pw.WindowFinding(
                finding.id,
                f"{finding.message}; {len(self.refused)} batch(es) of request bindings were "
                "not counted: their rows are not what a ledger entry covers (written behind "
                "the ledger's back)",
                {**finding.context, "unledgered_batches": shown},
            )
        return summary, finding
