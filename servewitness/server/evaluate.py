"""Evaluate registered runs over the latest evidence of every target."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from servewitness import wire
from servewitness.model import FileEntry, RunVerdict, TargetReport, manifest_digest
from servewitness.policy import Policy, PolicyError, evaluate_run, load_policy, refused_run
from servewitness.policy.engine import Judgements, policy_digest, selects_snapshot
from servewitness.policy.interface import TargetSnapshot
from servewitness.server import clock, report_rows
from servewitness.server.bounded import LruCache
from servewitness.server.store import RunRecord, Store, StoredReport

# Files of manifests kept parsed beyond those the latest snapshots hold (least recently used
# dropped; a manifest larger than this is not cached, its snapshot holds it while current):
# a vLLM process loads about 10,000 files, so this keeps about ten of them; an agent sending a
# fresh 200,000-file manifest in every report makes the verifier keep none of them.
MANIFEST_CACHE_FILES = 100_000
# After a status call, how long reports are judged as they arrive (``Evaluator.prejudge``): a
# client polling (``verifier wait``, a gate) keeps it on; a process nobody asks pays nothing.
PREJUDGE_S = 10.0

log = structlog.get_logger("verifier.evaluate")


@dataclass(frozen=True)
class Tracked:
    """What the verifier knows of one target: its latest snapshot, which report that is,
    when it last heard from it on the age clock (or, for a report loaded from the database,
    when this verifier started), whether it has expired (silent past ``--target-expiry``:
    kept for ``verifier target list``, left out of every run's verdict) and where the report
    is in storage order (what following other verifiers compares: ``server/follow.py``)."""

    snapshot: TargetSnapshot
    agent_id: str
    seq: int
    heard_boot_s: float
    expired: bool = False
    rowid: int = 0  # the report's place in storage order (0: not known)


class Evaluator:
    """Caches parsed policies (one per registered run's policy) and manifests by digest
    (bounded: MANIFEST_CACHE_FILES files), and every target's latest snapshot (loaded from
    the store once, then kept current by ``note`` on each ingest), so evaluating never scans
    or decodes stored reports."""

    def __init__(self, store: Store, manifest_cache_files: int = MANIFEST_CACHE_FILES) -> None:
        self.store = store
        # (digest, text) -> the policy: keyed by the text too, so a row whose text was edited
        # is never judged by what was cached under its digest, nor the reverse
        self._policies: dict[tuple[str, str], Policy | PolicyError] = {}
        self.manifests: LruCache[str, tuple[FileEntry, ...]] = LruCache(
            manifest_cache_files, weight=len
        )
        self._latest: dict[str, Tracked] | None = None
        # where following the database starts (``server/follow.py``): the marks read before
        # loading, and when on the age clock
        self._loaded_at: tuple[tuple[int, int], float] | None = None
        # a forgotten target's last report: what following must not bring back
        self._floors: dict[str, int] = {}
        self._lock = threading.Lock()
        # what evaluations of a (policy, target snapshot) found, reused until either changes
        self.judgements = Judgements()
        self._prejudge_until = 0.0  # judge reports as they arrive until then (``asked``)

    def policy(self, run: RunRecord) -> Policy | PolicyError:
        """RUN's parsed policy, or why this verifier refuses it: a run stored by an earlier
        verifier (or before its rules refused weak policies) may hold one that no longer
        loads, which is a verdict (``policy.refused``), not an internal error. So is a stored
        text that is not the policy its digest names (the database edited): the run was
        registered, and its seals name, that digest, so no other text may judge it."""
        key = (run.policy_digest, run.policy_toml)
        pol = self._policies.get(key)
        if pol is None:
            actual = policy_digest(run.policy_toml)
            if actual != run.policy_digest:
                log.error("stored_policy_edited", run=run.name, digest=run.policy_digest)
                pol = PolicyError(
                    run.source, None, None,
                    f"the stored policy text is not the policy the run was registered with "
                    f"({run.policy_digest}; the text stored now is {actual}): the database "
                    "was edited, and nothing is judged on it",
                )  # fmt: skip
            else:
                try:
                    pol = load_policy(run.policy_toml, run.source)
                except PolicyError as e:
                    pol = e
            self._policies[key] = pol
        return pol

    def _manifest(
        self, digest: str | None, given: Mapping[str, tuple[FileEntry, ...]]
    ) -> tuple[FileEntry, ...] | None:
        """The files stored under DIGEST; None where they are not known (no digest, or none
        stored under it): a process whose files are not known is judged as such (PENDING where
        a rule needs them, ``evidence.manifest_unresolved``), never as one that loaded
        nothing. Files read from the store are that digest's only if they derive it: a row
        edited at rest (an entry dropped or renamed) is not known files."""
        if digest is None:
            return None
        got = given.get(digest)
        if got is None:
            got = self.manifests.get(digest)
        if got is None:
            got = self.store.get_manifest(digest)
            if got is None:
                return None
            if manifest_digest(got) != digest:
                log.error("stored_manifest_edited", digest=digest, files=len(got))
                return None
        self.manifests.put(digest, got)
        return got

    def _snapshot(
        self,
        report: TargetReport,
        received_unix: float,
        authenticated_as: str | None,
        received_boot_s: float | None,
        given: Mapping[str, tuple[FileEntry, ...]] | None = None,
        *,
        transit_s: float = 0.0,
    ) -> TargetSnapshot:
        procs = tuple(
            p
            if p.files is not None
            else dataclasses.replace(p, files=self._manifest(p.manifest_digest, given or {}))
            for p in report.processes
        )
        containers = tuple(sorted({p.container_id for p in procs if p.container_id}))
        return TargetSnapshot(
            report.target,
            procs,
            received_unix,
            containers,
            report.collect_s,
            report.containers,
            report.unobservable,
            authenticated_as,
            received_boot_s,
            report.sent_unix,
            report.mixed_roots,
            age_known=not report.evidence_age_unknown,
            transit_s=transit_s,
        )

    def _load(self) -> dict[str, Tracked]:
        # Evidence stored before this verifier started: how it was authenticated is not known
        # now, so it counts as unauthenticated until its target reports again; nor when it
        # arrived on the age clock, whose origin was lost with the old process: not fresh.
        # Its silence for expiry counts from now. A target retired with this very report as
        # its last stays retired: forgotten ones are not loaded, expired ones stay expired.
        # Following starts at marks read first: whatever committed after them is read again.
        now = clock.boot_s()
        self._loaded_at = (self.store.read(report_rows.marks), now)
        retired = self.store.retired_targets()
        out: dict[str, Tracked] = {}
        for s in self.store.latest_reports():
            event, agent, seq = retired.get(s.target, ("", "", -1))
            if (agent, seq) == (s.agent_id, s.seq) and event == "forgotten":
                self._floors[s.target] = s.rowid
                continue
            try:
                report = wire.report_from_bytes(s.report)
            except wire.WireError as e:  # an edited row: never evidence, as when followed
                log.error("stored_report_unreadable", target=s.target, rowid=s.rowid, error=str(e))
                continue
            snap = self._snapshot(report, s.received_unix, None, None)
            expired = (agent, seq) == (s.agent_id, s.seq) and event == "expired"
            out[s.target] = Tracked(snap, s.agent_id, s.seq, now, expired, s.rowid)
        return out

    def follow_from(self) -> tuple[tuple[int, int], float]:
        """Where following the database starts: the last rowids of reports and target events
        when the evidence was loaded, and when (on the age clock) they were read."""
        with self._lock:
            self._tracked()
            if self._loaded_at is None:  # loaded before (a test set it): follow from now
                self._loaded_at = (self.store.read(report_rows.marks), clock.boot_s())
            return self._loaded_at

    def asked(self) -> None:
        """A status call asked for a run's verdict: judge ahead (``prejudge``) for the next
        ``PREJUDGE_S`` seconds."""
        self._prejudge_until = time.monotonic() + PREJUDGE_S

    def prejudge(self, snap: TargetSnapshot) -> None:
        """Judge SNAP now under every run's policy this verifier has loaded that covers its
        target, and make its verdict's message (``wire.target_verdict_to_pb``): both are
        kept (``Judgements.fresh``, the message by its verdict), so a status call finds them
        made instead of making them while its client waits (BENCHMARKS.md, "Status reads
        first"). Called as a report becomes its target's latest (ingested or followed), off
        the status calls' path; a policy loaded later judges on demand as before. Only while
        status calls ask this process (``asked``): one that nobody asks (another process of
        ``--processes N`` gets the status calls) judges nothing ahead."""
        if time.monotonic() >= self._prejudge_until:
            return
        now = time.time()
        for pol in list(self._policies.values()):
            if isinstance(pol, Policy) and selects_snapshot(pol, snap):
                wire.target_verdict_to_pb(self.judgements.fresh(pol, snap, now))

    def is_newer(self, target: str, rowid: int) -> bool:
        """Whether the report at ROWID is newer than what this verifier holds of TARGET (or
        last forgot of it)."""
        with self._lock:
            return rowid > self._held(target)

    def _held(self, target: str) -> int:
        """The rowid of TARGET's report this verifier holds, or of the last one it forgot
        (call with the lock held)."""
        t = self._tracked().get(target)
        return t.rowid if t is not None else self._floors.get(target, 0)

    def followed(
        self,
        report: TargetReport,
        stored: StoredReport,
        authenticated_as: str | None,
        received_boot_s: float | None,
        transit_s: float = 0.0,
    ) -> bool:
        """Make REPORT, which another verifier stored as STORED, its target's latest evidence
        unless this verifier holds a newer one. RECEIVED_BOOT_S: the earliest it can have been
        received, on this verifier's age clock (None: not known, so not fresh); TRANSIT_S:
        the longest it can have been on the way before that (its receipt says).

        Its silence, for expiry, counts from now: the *latest* it can have been received
        (it was committed before this poll read it). Freshness takes the earliest, expiry
        the latest: each errs on its safe side, so a receiver whose clock runs ahead makes
        its reports look old here (STALE) but never makes a live target expire (which drops
        it from every run's verdict: the unsafe side)."""
        snap = self._snapshot(
            report, stored.received_unix, authenticated_as, received_boot_s, transit_s=transit_s
        )
        heard = clock.boot_s()
        with self._lock:
            if stored.rowid <= self._held(report.target):
                return False
            held = self._tracked().get(report.target)
            if held is not None and held.agent_id == stored.agent_id and stored.seq <= held.seq:
                # an agent's seqs only grow: its older report stored after a newer one is a
                # row moved in the database (a writer replaying a genuine report), never newer
                log.error("followed_report_older", target=report.target, seq=stored.seq)
                return False
            self._tracked()[report.target] = Tracked(
                snap, stored.agent_id, stored.seq, heard, False, stored.rowid
            )
        self.prejudge(snap)
        return True

    def retired(
        self, target: str, event: str, last: tuple[str, int], expiry_s: float | None = None
    ) -> bool:
        """Another verifier expired or forgot (EVENT) TARGET with report LAST (agent id, seq)
        as its last: done here too if that is the report this verifier holds (a newer one
        keeps the target). An expiry is applied only when this verifier too has heard
        nothing of the target for EXPIRY_S (None: not checked): an expiry drops a target
        from every run's verdict, so one verifier's clock (or database row) alone must not
        make the others drop a target they hear from. Whether anything changed."""
        with self._lock:
            latest = self._tracked()
            t = latest.get(target)
            if t is None or (t.agent_id, t.seq) != last:
                return False
            heard_lately = expiry_s is not None and clock.boot_s() - t.heard_boot_s <= expiry_s
            if event == "expired" and heard_lately:
                return False
            if event == "forgotten":
                self._floors[target] = t.rowid
                del latest[target]
                return True
            if t.expired:
                return False
            latest[target] = dataclasses.replace(t, expired=True)
            return True

    def _tracked(self) -> dict[str, Tracked]:
        """Every known target (call with the lock held)."""
        if self._latest is None:
            self._latest = self._load()
        return self._latest

    def note(
        self,
        report: TargetReport,
        received_unix: float,
        authenticated_as: str | None = "local",
        received_boot_s: float | None = None,
        manifests: Mapping[str, tuple[FileEntry, ...]] | None = None,
        *,
        rowid: int = 0,
        transit_s: float = 0.0,
    ) -> None:
        """A report was stored (at ROWID in storage order; 0: not known): it is now its
        target's latest evidence (an expired or forgotten target is back, as new), unless one
        stored after it is already held (another verifier's, followed meanwhile).
        RECEIVED_BOOT_S: when it arrived on the age clock (``clock.boot_s``; None: now).
        MANIFESTS: the ones it brought (digest -> files), so they are not read back from
        the store. TRANSIT_S: the longest it can have been on the way before its receipt
        (``nonces.Issued.transit_s``)."""
        at = clock.boot_s() if received_boot_s is None else received_boot_s
        snap = self._snapshot(
            report, received_unix, authenticated_as, at, manifests, transit_s=transit_s
        )
        with self._lock:
            latest = self._tracked()
            held = latest.get(report.target)
            if rowid and held is not None and held.rowid > rowid:
                return
            latest[report.target] = Tracked(snap, report.agent_id, report.seq, at, False, rowid)
        self.prejudge(snap)

    def snapshots(self) -> list[TargetSnapshot]:
        """The latest snapshot of every target that is not expired: what verdicts judge."""
        with self._lock:
            latest = self._tracked()
            return [latest[t].snapshot for t in sorted(latest) if not latest[t].expired]

    def targets(self) -> list[Tracked]:
        """Every known target, expired ones included (``verifier target list``)."""
        with self._lock:
            latest = self._tracked()
            return [latest[t] for t in sorted(latest)]

    def due_to_expire(self, expiry_s: float) -> list[Tracked]:
        """Every target silent for longer than EXPIRY_S (on the age clock) and not expired
        yet. Marked expired (``retired``) only once its expiry is recorded in the ledger: a
        store that fails leaves it as it was, to be expired again."""
        now = clock.boot_s()
        with self._lock:
            latest = self._tracked()
            return [t for t in latest.values() if not t.expired and now - t.heard_boot_s > expiry_s]

    def get(self, target: str) -> Tracked | None:
        """TARGET as this verifier holds it (None: unknown), changing nothing."""
        with self._lock:
            return self._tracked().get(target)

    def forget(self, target: str) -> Tracked | None:
        """Drop TARGET (None: unknown); it comes back as new if it reports again."""
        with self._lock:
            gone = self._tracked().pop(target, None)
            if gone is not None:
                self._floors[target] = gone.rowid
            return gone

    def forgotten_up_to(self, target: str, rowid: int) -> None:
        """TARGET was retired with the report at ROWID as its last (reports stored before it
        that this verifier had not followed yet included): none of them brings it back."""
        with self._lock:
            self._floors[target] = max(self._floors.get(target, 0), rowid)
            t = self._tracked().get(target)
            if t is not None and t.rowid <= rowid:
                del self._tracked()[target]

    def run_verdict(
        self, run: RunRecord, now: float, snaps: list[TargetSnapshot] | None = None
    ) -> RunVerdict:
        """RUN's verdict at wall-clock time NOW (displayed); ages on the age clock, now."""
        pol = self.policy(run)
        if isinstance(pol, PolicyError):
            return refused_run(run.name, run.policy_digest, pol, now)
        expired: list[TargetSnapshot] = []
        if snaps is None:
            snaps = self.snapshots()
            expired = [t.snapshot for t in self.targets() if t.expired]
        return evaluate_run(
            run.name,
            pol,
            run.policy_digest,
            snaps,
            now,
            now_boot_s=clock.boot_s(),
            judgements=self.judgements,
            expired=expired,
        )
