"""The measurement gate, for harnesses: block until PASS, then check liveness held.

    from verifier.client import measurement

    with measurement("my-run", address="127.0.0.1:50551", timeout_s=120,
                     results=Path("results.json")) as m:
        write_results(run_benchmark())        # inside the block: the measured window
    # m.summary: verdicts, every hook's fires next to its steps during the block;
    # results.json.seal.json: the statement binding the results' sha256 to that evidence

``wait_for`` raises ``GateFailed`` (exit 1) on FAIL and ``TimeoutError_`` (exit 5) on timeout;
an unreachable verifier raises ``UnavailableError`` (exit 4). The block is a measurement
window (``verifier.client.window``): on leaving it the run is checked again, on evidence received
after the block ended; it must still PASS, and every hook must have kept pace with the steps
it is judged on during the block, or ``GateFailed`` is raised (after the statement, if any,
is written).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verifier.client.address import resolve
from verifier.client.api import VerifierClient
from verifier.client.window import fresh_status, is_fresh, pace, statement
from verifier.errors import CheckFailed, TimeoutError_
from verifier.model import RunVerdict, Severity, Verdict
from verifier.security.tls import client_tls


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
) -> RunVerdict:
    """Poll RUN until PASS (returned) or FAIL (GateFailed); TimeoutError_ after TIMEOUT_S.

    FRESH: the PASS returned rests on evidence every target read after the wait began (the
    verifier's clock at its first answer, so a client whose clock is off does not shift it):
    a measurement window opens on counts from its start, not on the last report before it
    (which can be a report interval or more older, and would let steps from before the
    window count in it). A FAIL ends the wait however old its evidence."""
    deadline = time.monotonic() + timeout_s
    since: float | None = None
    while True:
        verdict = client.status(run)
        if on_progress is not None:
            on_progress(verdict)
        if fresh and since is None:
            since = verdict.evaluated_unix
        if verdict.verdict == Verdict.PASS and (since is None or is_fresh(verdict, since)):
            return verdict
        if verdict.verdict == Verdict.FAIL:
            raise GateFailed(f"run {run} FAILED: {first_reason(verdict)}", verdict)
        if time.monotonic() >= deadline:
            state = verdict.verdict.value
            if verdict.verdict == Verdict.PASS:
                raise TimeoutError_(
                    f"run {run} PASSes, but no report read after the wait began arrived "
                    f"within {timeout_s:g} s"
                )
            reason = first_reason(verdict)
            raise TimeoutError_(f"run {run} still {state} after {timeout_s:g} s: {reason}")
        time.sleep(poll_s)


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
    before: RunVerdict
    after: RunVerdict | None = None
    summary: dict[str, Any] = field(default_factory=dict)


@contextmanager
def measurement(
    run: str,
    address: str | None = None,
    timeout_s: float = 120.0,
    results: Path | None = None,
) -> Iterator[Measurement]:
    """Wait for RUN to PASS, run the block, then seal the block as a measurement window
    (RESULTS, when given, must exist by then: its statement is written beside it). TLS and
    token come from VERIFIER_TLS_CA / _CERT / _KEY / VERIFIER_TOKEN when set."""
    with VerifierClient(resolve(address), tls=client_tls(None, None, None, None)) as client:
        t0 = time.time()
        before = wait_for(client, run, timeout_s, fresh=True)
        m = Measurement(run, before)
        yield m
        t1 = time.time()
        after = fresh_status(client, run, timeout_s)
        m.after = after
        rows, found = pace(before, after)
        m.summary = {
            "run": run,
            "policy_digest": after.policy_digest,
            "window_unix": [t0, t1],
            "verdict_before": before.verdict.value,
            "verdict_after": after.verdict.value,
            "hooks_during_block": rows,
            "findings": [{"id": f.id, "message": f.message} for f in found],
        }
        if results is not None:
            body, _ = statement(run, t0, before, after, results)
            out = results.with_name(results.name + ".seal.json")
            out.write_text(json.dumps(body, indent=2) + "\n")
            m.summary["statement"] = str(out)
        if after.verdict != Verdict.PASS:
            raise GateFailed(
                f"run {run} is {after.verdict.value} after the block: {first_reason(after)}", after
            )
        if found:
            raise GateFailed(
                f"liveness did not hold during the block: {found[0].message}"
                + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""),
                after,
            )
