"""Several verifiers on one database: each follows what the others store.

Replicas of the verifier behind one Service share a PostgreSQL database. An agent reports to
whichever replica its connection reached; a status call may reach another. So that no state is
known to one replica only, every replica follows the database: every ``FOLLOW_S`` it reads the
reports and target events stored after the last ones it saw (storage order: ``rowid``, which
grows in commit order because every write transaction holds one database-wide lock,
``db.PostgresDatabase.begin``), and makes each target's newest report its latest evidence, as
if it had received it, and each expiry or forget its own.

**Ages across replicas.** A report's age is measured on the age clock of the replica that
judges it (``server/clock.py``: CLOCK_BOOTTIME, which cannot be stepped), from when the report
was received. That clock is one host's: a replica cannot read another's. So the follower takes
the *earliest* time the report can have been received, on its own clock (older evidence is the
safe error: it can only make a target stale, never fresh):

1. The report was not visible when the previous poll began (``since_boot_s``), so its
   transaction committed after that; its receipt was ``lag_s`` before its row was written
   (the receiving replica measures that on its own clock and stores it with the row, in the
   receipt). Earliest receipt: ``since_boot_s - lag_s``. What this misses: the time between
   writing the row and the commit (the rest of one group-commit batch, and the commit).
2. The receiver's wall clock: ``received_unix`` against this replica's wall clock now. This
   bounds the commit's own time, which (1) misses, but trusts that the hosts' clocks agree.

The earlier of the two is used; evidence is fresh only when both say so. To be judged fresh
when it is not, a report would need a commit that stalls *and* a receiving host's clock that
runs ahead by as much (docs/threat-model.md, "Several verifiers on one database").

**Who sent it.** A report's receipt also says who its agent was authenticated as; a report
without one (stored by a verifier older than receipts) counts as unauthenticated, as reports
loaded at start always have.

**Only a verifier's rows.** Whoever can write the database can write a report row, its ledger
entry and a receipt naming any agent. A followed row is evidence only with its ledger entry
(``report_rows.ledgered_body``) and a receipt its receiver vouched for under the signing key
the verifiers share (``server/vouch.py``); any other is logged and never evidence.

Runs are read from the database when asked for (``Store.get_run``, ``list_runs``); nonces stay
each replica's own (an agent whose connection moves to another replica is told "nonce
mismatch" and says Hello again, which reads its last stored seq from the database).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from servewitness import wire
from servewitness.server import clock, report_rows, vouch
from servewitness.server.evaluate import Evaluator
from servewitness.server.metrics import VerifierMetrics
from servewitness.server.store import Store, StoredReport

log = structlog.get_logger("verifier.follow")

FOLLOW_S = 0.2
"""How often a verifier reads what other verifiers stored (gate latency grows by about this)."""

BATCH_ROWS = 10_000
"""The most rows one poll reads: a replica far behind catches up over several polls, in
bounded memory."""


@dataclass(frozen=True)
class Receipt:
    """How a verifier received a report: who its agent was authenticated as (None: nobody),
    how long the report waited from receipt until its row was written (its age clock), and
    the longest it can have been on the way to it (``nonces.Issued.transit_s``; 0 in a
    receipt written before transits were kept: dated by its receipt, as that verifier did)."""

    authenticated_as: str | None
    lag_s: float
    transit_s: float = 0.0
    vouch: str | None = None  # the receiving verifier's (``server/vouch.py``); None: none

    def vouched(self, key: bytes, row: str) -> bool:
        """Whether KEY's holder vouched for this receipt of ROW (``vouch.row_digest``)."""
        return vouch.checks(key, row, self.authenticated_as, self.lag_s, self.transit_s, self.vouch)


def receipt_json(
    authenticated_as: str | None,
    lag_s: float,
    transit_s: float = 0.0,
    *,
    key: bytes | None = None,
    row: str = "",
) -> str:
    """The receipt stored with a report's row (and covered by its ledger entry); with KEY,
    vouched for (``server/vouch.py``) as the receipt of ROW (``vouch.row_digest``)."""
    lag, transit = round(max(lag_s, 0.0), 6), round(max(transit_s, 0.0), 6)
    body: dict[str, object] = {
        "authenticated_as": authenticated_as,
        "lag_s": lag,
        "transit_s": transit,
    }
    if key is not None:
        body["vouch"] = vouch.vouch(key, row, authenticated_as, lag, transit)
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ReceiptAt:
    """A report's receipt, made when its row is written (the wait for its transaction counts
    in ``lag_s``): by this process, or by the writer process it is sent to (a pickle; the age
    clock, ``clock.boot_s``, is the host's, the same in every process)."""

    authenticated_as: str | None
    received_boot_s: float
    transit_s: float = 0.0
    key: bytes | None = None  # vouched for with it (``server/vouch.py``); None: not vouched
    row: str = ""  # the row it is the receipt of (``vouch.row_digest``)

    def __call__(self) -> str:
        lag_s = clock.boot_s() - self.received_boot_s
        return receipt_json(
            self.authenticated_as, lag_s, self.transit_s, key=self.key, row=self.row
        )


def parse_receipt(text: str | None) -> Receipt | None:
    """The receipt TEXT says, or None when there is none or it does not parse (a row stored
    before receipts, or one edited: its report then counts as unauthenticated, of unknown
    age)."""
    if text is None:
        return None
    try:
        got = json.loads(text)
        who, lag = got["authenticated_as"], got["lag_s"]
        transit, given = got.get("transit_s", 0.0), got.get("vouch")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not (who is None or isinstance(who, str)) or not (given is None or isinstance(given, str)):
        return None
    if not all(_span(x) for x in (lag, transit)):
        return None
    return Receipt(who, float(lag), float(transit), given)


def _span(x: object) -> bool:
    """X is a number of seconds >= 0 (a bool is not)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def earliest_receipt(
    receipt: Receipt, received_unix: float, since_boot_s: float, now_boot_s: float, now_unix: float
) -> float:
    """On this verifier's age clock, the earliest time a report another verifier stored can
    have been received: it committed after SINCE_BOOT_S (the previous poll began then and did
    not see it) and was received RECEIPT.lag_s before its row was written; and it was received
    at RECEIVED_UNIX on its receiver's wall clock, this long before NOW_UNIX on ours. The
    earlier of the two (module docstring)."""
    by_commit = since_boot_s - receipt.lag_s
    by_wall = now_boot_s - (now_unix - received_unix)
    return min(by_commit, by_wall)


class Follower:
    """Keeps an ``Evaluator`` current with what every verifier on its database stores."""

    def __init__(
        self,
        store: Store,
        evaluator: Evaluator,
        batch_rows: int = BATCH_ROWS,
        metrics: VerifierMetrics | None = None,
        expiry_s: float | None = None,
        *,
        receipt_key: bytes | None = None,
    ) -> None:
        self.store = store
        # the verifiers' key for receipts (server/vouch.py): with one, a row it did not
        # vouch for is never evidence; None (no signing key): receipts are taken as stored
        self.receipt_key = receipt_key
        self.evaluator = evaluator
        self.metrics = metrics
        self.expiry_s = expiry_s  # this verifier's --target-expiry: another's must agree
        self.batch_rows = batch_rows
        self._lock = threading.Lock()  # one poll at a time
        self._marks: tuple[int, int] | None = None
        self._since_boot_s = clock.boot_s()

    def count(self, kind: str) -> None:
        """One more of KIND in ``verifier_followed_total`` (when metrics were given)."""
        if self.metrics is not None:
            self.metrics.followed.labels(kind).inc()

    def begin(self) -> tuple[int, int]:
        """Load the evidence stored so far and follow from there (before serving: a report
        stored after this is followed, with its receipt, not loaded as of unknown age); the
        marks following is at."""
        with self._lock:
            return self._begun()

    def _begun(self) -> tuple[int, int]:
        if self._marks is None:
            self._marks, self._since_boot_s = self.evaluator.follow_from()
        return self._marks

    def poll(self) -> int:
        """Read what was stored since the last poll; how many targets it changed."""
        with self._lock:
            reports, events = self._begun()
            began = clock.boot_s()
            n = self.batch_rows
            new, got = self.store.read(
                lambda db: (
                    report_rows.after(db, reports, n),
                    report_rows.events_after(db, events, n),
                )
            )
            changed = self._reports(new, self._since_boot_s)
            if new:
                reports = new[-1].rowid
            for ev in got:
                events = ev.rowid
                if not self._vouched(ev):
                    continue
                if self.evaluator.retired(ev.target, ev.event, ev.last, self.expiry_s):
                    changed += 1
                    self.count("event")
            self._marks = (reports, events)
            # a poll that stopped at its batch size saw only part of what was committed
            # before it began: the rest is bounded by the same earlier mark, not this one
            if len(new) < self.batch_rows:
                self._since_boot_s = began
            return changed

    def _vouched(self, ev: report_rows.TargetEvent) -> bool:
        """Whether EV, a retirement another verifier stored, is one: its ledger entry records
        it and (with the verifiers' key) a verifier vouched for it. A forget or an expiry a
        writer of the database added would drop a target it hears from every run's verdict."""
        key = self.receipt_key
        if ev.ledgered and (key is None or ev.vouch == vouch.event_vouch(key, ev.row)):
            return True
        why = "no ledger entry records it" if not ev.ledgered else "no verifier vouched for it"
        log.error("followed_event_refused", target=ev.target, retirement=ev.event, why=why)
        return False

    def _reports(self, rows: list[StoredReport], since_boot_s: float) -> int:
        newest: dict[str, StoredReport] = {}
        for r in rows:  # storage order: the last one of a target is its newest
            newest[r.target] = r
        changed = 0
        for r in newest.values():
            if self.store.stored_here(r.rowid) or not self.evaluator.is_newer(r.target, r.rowid):
                continue  # this verifier stored it (and notes it), or knows a newer one
            body, ledgered = self.store.read(functools.partial(report_rows.ledgered_body, rep=r))
            if body is None:
                continue
            if not ledgered:  # written behind the ledger's back, or edited: never evidence
                log.error("followed_report_unledgered", target=r.target, rowid=r.rowid)
                continue
            receipt = parse_receipt(r.receipt)
            if self.receipt_key is not None:
                row = vouch.row_digest(r.agent_id, r.seq, r.target, r.received_unix, body)
                if receipt is None or not receipt.vouched(self.receipt_key, row):
                    # written with the ledger by a writer of the database, not a verifier
                    # (or by a verifier with another --signing-key: they must share one)
                    log.error(
                        "followed_report_not_vouched",
                        target=r.target,
                        rowid=r.rowid,
                        hint="not a verifier's under this --signing-key: every verifier on "
                        "one database must share it",
                    )
                    continue
            try:
                report = wire.report_from_bytes(body)
            except wire.WireError as e:  # an edited row: never evidence
                log.error(
                    "followed_report_unreadable", target=r.target, rowid=r.rowid, error=str(e)
                )
                continue
            if (report.agent_id, report.target, report.seq) != (r.agent_id, r.target, r.seq):
                log.error("followed_report_mismatch", target=r.target, rowid=r.rowid)
                continue  # a row whose body is another report's: edited, never evidence
            at = None
            who = None
            if receipt is not None:
                who = receipt.authenticated_as
                at = earliest_receipt(
                    receipt, r.received_unix, since_boot_s, clock.boot_s(), time.time()
                )
            transit = 0.0 if receipt is None else receipt.transit_s
            if self.evaluator.followed(report, r, who, at, transit):
                changed += 1
                self.count("report")
        return changed


def run(
    follower: Follower,
    stop: threading.Event,
    changed: Callable[[], None],
    turn: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
) -> None:
    """Poll every ``FOLLOW_S`` until STOP; CHANGED after a poll that changed a target; each
    poll in TURN (``admission.ReadsFirst.turn``: after a status call running). A failed poll
    (the database away) is logged, counted and tried again."""
    while not stop.wait(FOLLOW_S):
        try:
            with turn():
                polled = follower.poll()
            if polled:
                changed()
        except Exception as e:  # noqa: BLE001 - logged; the next poll tries again
            follower.count("failed")
            log.error("follow_failed", error=f"{type(e).__name__}: {e}")
