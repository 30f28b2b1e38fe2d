"""The measurement gate, for harnesses: block until PASS, then check liveness held.

    from servewitness.client import measurement

    with measurement("my-run", address="127.0.0.1:50551", timeout_s=120,
                     results=Path("results.json")) as m:
        write_results(run_benchmark())        # inside the block: the measured window
    # m.summary: held, verdicts, every hook's fires next to its steps during the block;
    # results.json.seal.json: the verifier's signed seal binding the results' sha256 to it

``wait_for`` raises ``GateFailed`` (exit 1) on FAIL and ``TimeoutError_`` (exit 5) on timeout;
a verifier that is unreachable is called again until the timeout, then ``UnavailableError``
(exit 4) is raised. ``measurement`` is a window
the verifier opens and seals itself (``OpenWindow``/``SealWindow``, judged from its own stored
reports): on leaving the block the run must still PASS on evidence received after the block
ended, and every hook must have kept pace with the steps it is judged on during the block, or
``GateFailed`` is raised (after the signed seal, if any, is written).

Every answer is checked against what was asked (``client/window.py``): the window opened must
be on the run asked, the seal handed back must name that window, run, results and request
ids (a genuine seal of another window is refused, ``GateFailed``, and never written), and the
outcome is the seal's signed content, not the answer's flag. With ``key=`` (or
``$VERIFIER_SEAL_KEY``), the verifier's public key, the seal's signature is checked too;
without it ``summary["signature"]`` says it was not.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness import wire
from servewitness.client.address import resolve
from servewitness.client.api import VerifierClient
from servewitness.client.deadline import Deadline, Outage, cut_short, retrying
from servewitness.client.window import (
    SEAL_REFUSED,
    AnswerMismatch,
    CheckedSeal,
    Expected,
    is_fresh,
    open_window,
    seal,
    seal_key,
    seal_window,
)
from servewitness.errors import CheckFailed, Error, TimeoutError_, UnavailableError
from servewitness.model import RunVerdict, Severity, Verdict
from servewitness.security.tls import client_tls

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


class GateFailed(CheckFailed):
    def __init__(self, message: str, verdict: RunVerdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict


def wait_for(
    client: VerifierClient,
    run: str,
    timeout_s: float,
    poll_s: float = 0.2,
    on_progress: Callable[[RunVerdict], None] | None = None,
    *,
    fresh: bool = False,
    on_retry: Callable[[Error], None] | None = None,
) -> RunVerdict:
    """Poll RUN until PASS (returned) or FAIL (GateFailed) within TIMEOUT_S.

    Every call's deadline is bounded by what is left of TIMEOUT_S, and a verifier that is
    unreachable, hung, restarting or busy is called again with backoff (ON_RETRY is told each
    time) until then, so the wait returns within TIMEOUT_S (plus at most one call's teardown)
    whatever the peer does. At the end: TimeoutError_ (exit 5) when the verifier answered
    last and the run is not decided; UnavailableError (exit 4) when it could not be reached at
    the end (saying whether it ever answered, and for how long it had not). Other errors (an
    unknown run, a refused credential, a verdict of another run than RUN: AnswerMismatch,
    exit 7) are raised at once.

    FRESH: the PASS returned rests on evidence every target read after the wait began (the
    verifier's clock at its first answer, so a client whose clock is off does not shift it):
    a measurement window opens on counts from its start, not on the last report before it
    (which can be a report interval or more older, and would let steps from before the
    window count in it). A FAIL ends the wait however old its evidence."""
    deadline = Deadline(timeout_s)
    outage = Outage()
    since: float | None = None
    verdict: RunVerdict | None = None
    short: list[float] = []  # the last failed call's time, when it was cut short (cut_short)

    def poll() -> RunVerdict:
        given = client.call_timeout()
        short.clear()
        try:
            got = client.status(run)
        except Error as e:
            if cut_short(e, given):
                short.append(given)
            raise
        if got.run != run:  # an answer for another run is no answer about RUN
            raise AnswerMismatch(
                f"the verifier answered with the verdict of run {got.run!r}, not of run {run!r}",
                "GetRunStatus",
            )
        return got

    with client.within(deadline):
        while True:
            if verdict is not None and deadline.passed():
                raise _timed_out(run, verdict, timeout_s)
            got = retrying(poll, deadline, outage, on_retry)
            if got is None:
                if verdict is not None and short and outage.attempts_in_stretch == 1:
                    # the verifier answered the call before; this one had only what was
                    # left of the timeout: the run is undecided, not the verifier unreachable
                    raise _timed_out(
                        run, verdict, timeout_s, f"; the last call had {short[0]:.3f} s left"
                    )
                was = "" if verdict is None else f"; run {run} was {verdict.verdict.value} then"
                raise UnavailableError(outage.describe(deadline) + was)
            verdict = got
            if on_progress is not None:
                on_progress(verdict)
            if fresh and since is None:
                since = verdict.evaluated_unix
            if verdict.verdict == Verdict.PASS and (since is None or is_fresh(verdict, since)):
                return verdict
            if verdict.verdict == Verdict.FAIL:
                raise GateFailed(f"run {run} FAILED: {first_reason(verdict)}", verdict)
            time.sleep(min(poll_s, deadline.left()))


def _timed_out(run: str, verdict: RunVerdict, timeout_s: float, note: str = "") -> TimeoutError_:
    if verdict.verdict == Verdict.PASS:
        return TimeoutError_(
            f"run {run} PASSes, but no report read after the wait began arrived "
            f"within {timeout_s:g} s{note}"
        )
    reason = first_reason(verdict)
    return TimeoutError_(
        f"run {run} still {verdict.verdict.value} after {timeout_s:g} s: {reason}{note}"
    )


_RANK = {Severity.ERROR: 0, Severity.PENDING: 1, Severity.WARNING: 2, Severity.INFO: 3}


def first_reason(verdict: RunVerdict) -> str:
    """The most severe finding (one line), and how many more of at least that severity."""
    found = list(verdict.findings) + [f for t in verdict.targets for f in t.findings]
    found = [f for f in found if f.severity != Severity.INFO]
    if not found:
        return "no findings"
    found.sort(key=lambda f: _RANK[f.severity])
    top = found[0]
    more = sum(1 for f in found[1:] if f.severity == top.severity)
    return f"{top.id}: {top.message}" + (f" (+{more} more)" if more else "")


def hook_counts(verdict: RunVerdict) -> dict[str, dict[str, int]]:
    """Per target/process/hook: fired on productive steps and productive steps (from findings'
    hook summaries)."""
    out: dict[str, dict[str, int]] = {}
    for t in verdict.targets:
        for h in t.hooks:
            key = f"{t.target}/pid {h.pid}/{h.name}"
            out[key] = {
                "fired_productive": h.fired_productive,
                "productive_steps": h.productive_steps,
                "fired": h.fired,
                "total_steps": h.total_steps,
            }
    return out


@dataclass
class Measurement:
    run: str
    window: wire.OpenedWindow
    # The seal's answer with the outcome of its checked, signed content (``checked.held``).
    sealed: wire.SealedWindow | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    # The request ids the block sent (its X-Request-Id values): when any is added, each must
    # have been served by the window's processes (the seal's requests check).
    request_ids: list[str] = field(default_factory=list)


NO_RESULTS_SHA256 = hashlib.sha256(b"").hexdigest()


@contextmanager
def measurement(
    run: str,
    address: str | None = None,
    timeout_s: float = 120.0,
    results: Path | None = None,
    key: Path | str | None = None,
) -> Iterator[Measurement]:
    """Open a window on RUN (the verifier waits for a PASS on fresh evidence), run the block,
    then have the verifier seal it. RESULTS, when given, must exist by then: the signed seal
    binds its sha256 and is written beside it (RESULTS.seal.json); without it the seal binds
    the empty string's digest and is kept in ``summary["seal_json"]``. TLS and token come
    from VERIFIER_TLS_CA / _CERT / _KEY / VERIFIER_TOKEN when set. Raises ``GateFailed`` when
    the window did not hold (after the seal is written). Request ids the block appends to
    ``request_ids`` are checked at the seal: each must have been served by the window's
    processes after it opened (none appended: not checked, and the seal says so).

    Every answer is checked (``client/window.py``): a window opened on another run raises
    ``GateFailed`` before the block runs; a seal that does not name this window, run, results
    and request ids, or whose signed content and answer disagree on held, raises it after
    the block, and is not written. ``summary["held"]`` is the checked content's. KEY (else
    $VERIFIER_SEAL_KEY): the verifier's public key, which the seal's signature is checked
    with (a key that cannot be read: ConfigError, before the window opens); without one it is
    not, and ``summary["signature"]`` says so."""
    public = seal_key(key)  # a key that cannot be read: ConfigError before anything opens
    with VerifierClient(resolve(address), tls=client_tls(None, None, None, None)) as client:
        try:
            opened = open_window(client, run, timeout_s)
        except (CheckFailed, AnswerMismatch) as e:  # a FAIL, or a window on another run:
            # the block never runs
            raise GateFailed(e.explain()) from None
        m = Measurement(run, opened)
        yield m
        ids = wire.request_ids(m.request_ids, "Measurement.request_ids")
        expected = Expected.of(opened)
        try:
            checked = _seal(client, m, results, timeout_s, ids, expected, public)
        except SEAL_REFUSED as e:
            raise GateFailed(e.explain()) from None
        content = checked.content
        m.sealed = checked.sealed
        m.summary.update(
            {
                "run": run,
                "window_id": opened.window_id,
                "policy_digest": content["policy_digest"],
                "window_unix": [content["opened_unix"], content["sealed_unix"]],
                "verdict_before": content["verdict_at_open"],
                "verdict_after": content["verdict_at_seal"],
                "held": checked.held,
                "signature": checked.signature(),
                "signature_checked": checked.key_id is not None,
                "signature_key_id": checked.key_id,
                "hooks_during_block": content["hooks"],
                "requests": content.get("requests"),
                "findings": [{"id": f["id"], "message": f["message"]} for f in content["findings"]],
            }
        )
        if not checked.held:
            found = content["findings"]
            raise GateFailed(
                f"the window did not hold: {found[0]['message'] if found else 'no reason'}"
                + (f" (+{len(found) - 1} more)" if len(found) > 1 else "")
            )


def _seal(  # noqa: PLR0917 - the measurement's parts
    client: VerifierClient,
    m: Measurement,
    results: Path | None,
    timeout_s: float,
    ids: tuple[str, ...],
    expected: Expected,
    key: Ed25519PublicKey | None,
) -> CheckedSeal:
    """Seal M's window (over RESULTS, or the empty string's digest), checked."""
    wid = m.window.window_id
    if results is not None:
        checked, path = seal(
            client, wid, m.run, results, timeout_s, request_ids=ids, expected=expected, key=key
        )
        m.summary["statement"] = str(path)
        return checked
    sealing = wire.WindowSealing(wid, m.run, NO_RESULTS_SHA256, 0, "-", timeout_s, ids)
    checked = seal_window(client, sealing, expected, key)
    m.summary["seal_json"] = checked.seal_json
    return checked
