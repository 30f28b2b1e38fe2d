"""How long a client call may take: the time the user gave, never a fixed time per call.

A command given a time (``wait --timeout S``, ``window``/``seal``/``exec --timeout S``) holds a
:class:`Deadline` that ends S seconds after it began; every RPC it makes is given
``min(per-call default, time left)`` (:meth:`Deadline.rpc_timeout`), so whatever the peer does
(nothing listening, a listener that accepts and never answers, garbage bytes, a TLS handshake
that stalls) the command returns within S plus the time to print and exit. Commands without a
time of their own (``status``, ``run list``, ``target list``, ``audit … --verifier``) give
each call the per-call default alone (``--rpc-timeout``; :data:`DEFAULT_RPC_TIMEOUT_S`).

:func:`retrying` runs a call again while it fails for a reason that can pass (the verifier is
unreachable, restarting, hung or busy: :func:`transient`) with capped exponential backoff, until
the deadline; any other error (an unknown run, a refused credential, a bad argument) is
raised at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from servewitness.errors import Error, NoAnswerInTime, UnavailableError

T = TypeVar("T")

DEFAULT_RPC_TIMEOUT_S = 10.0  # one call without a time given by the user (--rpc-timeout)
FIRST_BACKOFF_S = 0.1  # the first pause before calling an unreachable verifier again
MAX_BACKOFF_S = 1.0  # the longest pause: a verifier back up is seen within about a second
# a call given less than this that got no answer says nothing about the verifier: on a loaded
# host a healthy status answer can take a few hundred ms, and the last poll of a wait is given
# only what is left of its --timeout (which can be a millisecond)
FAIR_CALL_S = 1.0


@dataclass(frozen=True)
class Deadline:
    """The end of the time a command was given, on the monotonic clock."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    @property
    def end(self) -> float:
        return self.started + self.seconds

    def left(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.end - time.monotonic())

    def passed(self) -> bool:
        return self.left() <= 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def rpc_timeout(self, per_call_s: float) -> float:
        """One call's gRPC deadline: the per-call default or the time left, the smaller."""
        return min(per_call_s, self.left())


def transient(e: Error) -> bool:
    """Whether E can pass on its own (worth calling again): the verifier unreachable, hung,
    restarting or busy. A refused credential is not (``NotAuthorized``), nor an answer."""
    return type(e) in (UnavailableError, NoAnswerInTime)


def cut_short(e: Error, given_s: float) -> bool:
    """Whether E is a call that got no answer only because it was given less than
    FAIR_CALL_S (GIVEN_S) by the command's own deadline: the command ran out of time, the
    verifier was not shown to be unreachable."""
    return isinstance(e, NoAnswerInTime) and given_s < FAIR_CALL_S


@dataclass
class Outage:
    """What a retrying caller saw of an unreachable verifier: when it was first unreachable in
    the current stretch (None: it answered last), how many calls failed, the last error."""

    since: float | None = None  # monotonic
    attempts: int = 0  # calls that failed, in all
    last: Error | None = None
    ever_answered: bool = False
    attempts_in_stretch: int = 0  # calls that failed since it last answered

    def failed(self, e: Error, began: float | None = None) -> None:
        """E ended a call; BEGAN (monotonic): when that call was made (the verifier has not
        been shown reachable since then), now when not given."""
        if self.since is None:
            self.since = time.monotonic() if began is None else began
        self.attempts += 1
        self.attempts_in_stretch += 1
        self.last = e

    def answered(self) -> None:
        self.since = None
        self.ever_answered = True
        self.attempts_in_stretch = 0

    def describe(self, deadline: Deadline) -> str:
        """One line: the last failure, and for how long of DEADLINE it lasted."""
        last = str(self.last) if self.last is not None else "no answer"
        tries = f"{self.attempts} attempt{'s' if self.attempts != 1 else ''}"
        if not self.ever_answered:
            return f"{last}; unreachable for the whole {deadline.seconds:g} s ({tries})"
        since = time.monotonic() - (self.since if self.since is not None else deadline.end)
        return (
            f"{last}; unreachable for the last {since:.1f} s of {deadline.seconds:g} s "
            f"(it answered before; {tries})"
        )


def backoff(attempt: int) -> float:
    """The pause after the ATTEMPT-th failure in a row (1-based): 0.1, 0.2, 0.4, 0.8, 1, 1…"""
    return float(min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** max(0, attempt - 1)))


def retrying(
    call: Callable[[], T],
    deadline: Deadline,
    outage: Outage,
    on_retry: Callable[[Error], None] | None = None,
) -> T | None:
    """CALL's answer, calling again after transient failures until DEADLINE; None when the
    deadline passed with the verifier still unreachable (OUTAGE says since when and why).
    Every other error is raised at once."""
    run = 0
    while True:
        began = time.monotonic()
        try:
            got = call()
        except Error as e:
            if not transient(e):
                raise
            outage.failed(e, began)
            run += 1
            if on_retry is not None:
                on_retry(e)
            pause = min(backoff(run), deadline.left())
            if pause <= 0.0:
                return None
            time.sleep(pause)
            continue
        outage.answered()
        return got
