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
from servewitness.server import clock, report_rows
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
    """How a verifier received a report: who its agent was authenticated as (None: nobody)
    and how long the report waited from receipt until its row was written (its age clock)."""

    authenticated_as: str | None
    lag_s: float


def receipt_json(authenticated_as: str | None, lag_s: float) -> str:
    """The receipt stored with a report's row (and covered by its ledger entry)."""
    body = {"authenticated_as": authenticated_as, "lag_s": round(max(lag_s, 0.0), 6)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class ReceiptAt:
    """A report's receipt, made when its row is written (the wait for its transaction counts
    in ``lag_s``): by this process, or by the writer process it is sent to (a pickle; the age
    clock, ``clock.boot_s``, is the host's, the same in every process)."""

    authenticated_as: str | None
    received_boot_s: float

    def __call__(self) -> str:
        return receipt_json(self.authenticated_as, clock.boot_s() - self.received_boot_s)


def parse_receipt(text: str | None) -> Receipt | None:
    """The receipt TEXT says, or None when there is none or it does not parse (a row stored
    before receipts, or one edited: its report then counts as unauthenticated, of unknown
    age)."""
    if text is None:
        return None
    try:
        got = json.loads(text)
        who, lag = got["authenticated_as"], got["lag_s"]
    except (ValueError, TypeError, KeyError):
        return None
    if not (who is None or isinstance(who, str)) or isinstance(lag, bool):
        return None
    if not isinstance(lag, int | float) or not math.isfinite(lag) or lag < 0:
        return None
    return Receipt(who, float(lag))


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
    ) -> None:
        self.store = store
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
            for rowid, target, event, agent, seq in got:
                events = rowid
                if self.evaluator.retired(target, event, (agent, seq), self.expiry_s):
                    changed += 1
                    self.count("event")
            self._marks = (reports, events)
            # a poll that stopped at its batch size saw only part of what was committed
            # before it began: the rest is bounded by the same earlier mark, not this one
            if len(new) < self.batch_rows:
                self._since_boot_s = began
            return changed

    def _reports(self, rows: list[StoredReport], since_boot_s: float) -> int:
        newest: dict[str, StoredReport] = {}
        for r in rows:  # storage order: the last one of a target is its newest
            newest[r.target] = r
        changed = 0
        for r in newest.values():
            if self.store.stored_here(r.rowid) or not self.evaluator.is_newer(r.target, r.rowid):
                continue  # this verifier stored it (and notes it), or knows a newer one
            body = self.store.read(functools.partial(report_rows.body, rowid=r.rowid))
            if body is None:
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
            receipt = parse_receipt(r.receipt)
            at = None
            who = None
            if receipt is not None:
                who = receipt.authenticated_as
                at = earliest_receipt(
                    receipt, r.received_unix, since_boot_s, clock.boot_s(), time.time()
                )
            if self.evaluator.followed(report, r, who, at):
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
