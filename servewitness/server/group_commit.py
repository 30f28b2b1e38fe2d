"""Group commit: reports that arrive while a transaction commits are written together, in one
transaction and one fsync, and each caller returns only once ITS write is committed.

Why: with ``synchronous=FULL`` (SQLite) or a PostgreSQL commit, the fsync per report was the
largest single cost of ingest (21 % of the verifier's CPU at 500 agents, BENCHMARKS.md); one
commit for every report waiting costs about as much as one for a single report.

How (leader and followers, no thread of its own): a caller appends its write to the pending
list; if no batch is being written it becomes the leader, opens the transaction (waiting for the
database's write lock: another verifier on the same database, or this one's own reads) and
only then takes everything pending and writes it (``run_batch``); callers that arrive
meanwhile wait, and when the batch is done one of them leads the next. Taking the batch once
the lock is held puts every write that arrived during the wait into it: one commit for them
instead of one more each (measured with two verifier processes on one SQLite file, where a
leader waits for the other's transaction: BENCHMARKS.md, "The write lock's work"). Durability
is unchanged: a caller returns (and the servicer acknowledges) only after the transaction
holding its write committed.

Failure: when a batch's transaction fails, nothing of it was committed; each of its writes is
then tried again alone, so only the writes that fail alone fail (a report the database
refuses, or all of them when the disk is full), and every caller gets its own outcome. A
failure that says nothing about the writes themselves (SHARED: another writer held the
database past the bound) fails them all at once: retried alone, each would wait as long again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# The most writes one transaction takes: a bound on how long its lock is held and how much
# one failed batch has to retry.
MAX_BATCH = 256


class _Write(Generic[T]):
    __slots__ = ("done", "error", "label", "on_done", "result", "write")

    def __init__(
        self, write: Callable[[Any], T], label: str, on_done: Callable[[_Write[T]], None] | None
    ) -> None:
        self.write = write
        self.label = label
        self.on_done = on_done  # enqueue's: told the outcome (no thread waits for it)
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None


# What RUN_BATCH is given: TAKE, called once inside the open transaction, returns the batch's
# writes and a label for them ("report AGENT/SEQ" for one, "N writes" for several).
Take = Callable[[], tuple[Sequence[Callable[[Any], T]], str]]


class GroupCommit(Generic[T]):
    """Writes submitted concurrently, committed together. RUN_BATCH(take) opens ONE
    transaction, calls TAKE once it holds the database's write lock, runs every write TAKE
    returned (each given the database connection) and commits, returning their results in
    order, raising if it did not commit; a batch of one is also how a write is retried
    alone."""

    def __init__(
        self,
        run_batch: Callable[[Take[T]], list[T]],
        max_batch: int = MAX_BATCH,
        shared: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._run_batch = run_batch
        self._max = max_batch
        self._shared = shared
        self._cond = threading.Condition()
        self._pending: list[_Write[T]] = []
        self._leading = False
        self._closed = False
        self.batches: list[int] = []  # sizes of the last transactions tried (tests, debugging)

    def submit(self, write: Callable[[Any], T], label: str = "write") -> T:
        """Run WRITE (given the store's connection, it executes statements) in a transaction with
        whatever else is pending; its result once that transaction committed. Raises what
        WRITE raised when it was tried alone."""
        item: _Write[T] = _Write(write, label, None)
        with self._cond:
            self._pending.append(item)
        # Lead batches until this write's is done: a leader takes the oldest MAX_BATCH pending
        # writes, which need not include its own (more were waiting): it then leads again.
        while True:
            with self._cond:
                while self._leading and not item.done:
                    self._cond.wait()
                if item.done:
                    break
                self._leading = True
            self._lead_once()
        if item.error is not None:
            raise item.error
        return item.result  # type: ignore[return-value]  # done without error: set

    def enqueue(
        self,
        write: Callable[[Any], T],
        label: str,
        done: Callable[[T | None, BaseException | None], None],
    ) -> None:
        """WRITE queued, no thread waiting for it: ``lead_pending`` commits it with whatever
        else is pending and then calls DONE(result, None), or DONE(None, what it raised when
        tried alone) (the writer process: a serving process waits for the answer)."""

        def told(w: _Write[T]) -> None:
            done(w.result, w.error)

        with self._cond:
            if self._closed:
                raise RuntimeError("enqueue after close")
            self._pending.append(_Write(write, label, told))
            self._cond.notify_all()

    def lead_pending(self) -> None:
        """Lead batches of what ``enqueue`` queued until ``close`` (the writer process's one
        thread): each batch taken once its transaction holds the database's write lock."""
        while True:
            with self._cond:
                while not self._closed and (self._leading or not self._pending):
                    self._cond.wait()
                if not self._pending and self._closed:
                    return
                if self._leading:  # closed, a submit leading: wait for it
                    self._cond.wait()
                    continue
                self._leading = True
            self._lead_once()

    def _lead_once(self) -> None:
        """Lead one batch (the caller made itself the leader), then let the next one lead."""
        try:
            self._lead()
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()

    def close(self) -> None:
        """No more ``enqueue``: ``lead_pending`` returns once what is queued is done."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _take(self) -> list[_Write[T]]:
        with self._cond:
            batch, self._pending = self._pending[: self._max], self._pending[self._max :]
        self.batches = [*self.batches[-63:], len(batch)]
        return batch

    @staticmethod
    def _label(batch: Sequence[_Write[T]]) -> str:
        return batch[0].label if len(batch) == 1 else f"{len(batch)} writes"

    def _lead(self) -> None:
        taken: list[_Write[T]] = []

        def take() -> tuple[list[Callable[[Any], T]], str]:
            if taken:
                raise RuntimeError("a batch is taken once per transaction")
            taken.extend(self._take())
            return [w.write for w in taken], self._label(taken)

        try:
            results = self._run_batch(take)
        except Exception as e:  # noqa: BLE001 - nothing committed: each write is tried alone
            opened = bool(taken)
            if not opened:  # the transaction never opened: none of these writes was tried
                taken.extend(self._take())
            if len(taken) == 1 or isinstance(e, self._shared) or not opened:
                for w in taken:
                    w.error, w.done = e, True
                _told(taken)
                return
            for w in taken:
                self._alone(w)
            _told(taken)
            return
        except BaseException as e:
            taken = taken or self._take()
            for w in taken:
                w.error, w.done = e, True
            _told(taken)
            raise
        if not taken:
            raise RuntimeError("run_batch committed without taking its batch")
        for w, r in zip(taken, results, strict=True):
            w.result, w.done = r, True
        _told(taken)

    def _alone(self, w: _Write[T]) -> None:
        self.batches = [*self.batches[-63:], 1]
        try:
            w.result = self._run_batch(lambda: ([w.write], w.label))[0]
        except BaseException as e:  # noqa: BLE001 - handed to the caller that submitted it
            w.error = e
        w.done = True


def _told(writes: Sequence[_Write[Any]]) -> None:
    """Tell each enqueued write of WRITES its outcome (a waiting caller needs no telling)."""
    for w in writes:
        if w.on_done is not None:
            w.on_done(w)
