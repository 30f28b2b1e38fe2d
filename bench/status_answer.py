"""The status answer for a run over many targets: building GetRunStatus's message, with what
the evaluator keeps between calls reused (findings' messages, fresh target verdicts and their
messages) against built on every call.

The verifier keeps each (policy, target snapshot)'s findings between status calls
(``policy.engine.Judgements``), so the same finding objects come back call after call; their
protobuf messages (a JSON encoding of each context among them) were rebuilt every time, ~80 % of
a status call's CPU at 500 targets (cProfile). Then each target verdict's message was still
built on every call, though a fresh target's verdict differs from the last call's only in its
time. Arms, interleaved over ROUNDS rounds of N calls:
  built per call  every finding converted on every call (before 424e265)
  findings kept   a finding's message built once and reused while the finding is kept
  verdicts kept   also a fresh target's verdict kept (``Judgements.fresh``) and its message
                  copied with the call's time (``wire.verdicts._set_target_verdict``)
Each call is what GetRunStatus does after its authorization: the evaluator's run verdict at
the current time and its conversion to the response message, serialized. Every arm's answer
is checked equal first. Targets: TARGETS, one report each (API server, engine core, worker
with a hook), a policy requiring the hook. Prints ms per call, the ratios, the noise floor.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests' evidence builders
import _smoke
from _stats import interleaved_ns, print_rows

TARGETS = 500
ROUNDS = 15
N = 10


def _evaluator(d: Path, targets: int) -> tuple[Any, Any]:
    """An evaluator over a store in D holding one report of each of TARGETS targets, and the
    run whose policy requires their worker's hook."""
    from servewitness.model import TargetReport
    from servewitness.policy import policy_digest
    from servewitness.server import clock
    from servewitness.server.evaluate import Evaluator
    from servewitness.server.store import Store
    from tests.helpers import as_weak_as_needed
    from tests.test_policy_engine import HOOK_V1, api, engine, worker

    ev = Evaluator(Store(d / "db.sqlite3"))
    policy = as_weak_as_needed(f"version = 1\n{HOOK_V1}[evidence]\nfreshness_s = 3600\n")
    run = ev.store.register_run("r", policy, policy_digest(policy), "bench")
    now = time.time()
    for i in range(targets):
        t = f"t{i}"
        report = TargetReport("a-" + t, t, 1, "", now, (api(), engine(), worker()))
        ev.note(report, now, "local", clock.boot_s())
    return ev, run


class _Forgets(dict[Any, Any]):
    """A cache that keeps nothing: every call builds."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


def _answers(ev: Any, run: Any) -> Callable[[str], bytes]:
    """One status answer's bytes as ARM makes it."""
    from servewitness import wire
    from servewitness.wire import verdicts

    kept, built = verdicts.finding_to_pb, verdicts._finding_to_pb
    keep_verdicts, judgements = verdicts._VERDICTS_KEPT, ev.judgements

    def not_fresh(policy: Any, snap: Any, now: float) -> Any:  # as before: made anew
        return policy.verdict_of(snap, judgements.judged(policy, snap), now, None, False)

    def answer(arm: str) -> bytes:
        verdicts.finding_to_pb = built if arm == "built per call" else kept
        whole = arm == "verdicts kept"
        verdicts._VERDICTS_KEPT = keep_verdicts if whole else _Forgets()
        if whole:
            judgements.__dict__.pop("fresh", None)
        else:
            judgements.fresh = not_fresh
        msg = wire.get_run_status_response_to_pb(ev.run_verdict(run, time.time()))
        return bytes(msg.SerializeToString())

    return answer


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--targets", type=int, default=TARGETS)
    _smoke.add_args(parser)
    args = parser.parse_args()
    targets, rounds, n = args.targets, ROUNDS, N
    if args.smoke:
        _smoke.begin("every arm, 20 targets, 2 calls per round")
        targets, rounds, n = 20, _smoke.ROUNDS, 2

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb

    arms = ("built per call", "findings kept", "verdicts kept")
    with tempfile.TemporaryDirectory() as d:
        ev, run = _evaluator(Path(d), targets)
        answer = _answers(ev, run)

        # The same answer from every arm (the times inside are the call's: compare without).
        def told(arm: str) -> list[Any]:
            got = wire.get_run_status_response_from_pb(
                pb.GetRunStatusResponse.FromString(answer(arm))
            )
            return [(t.target, t.verdict, t.findings, t.hooks) for t in got.targets]

        answers = [told(arm) for arm in (*arms, "verdicts kept")]  # kept: also its 2nd call
        same = all(a == answers[0] for a in answers)
        print(f"the same answer from every arm: {same}")
        if not same:
            raise SystemExit(1)
        s = interleaved_ns({arm: functools.partial(answer, arm) for arm in arms}, rounds, n)
        answer("verdicts kept")  # leave the code as it runs
    ms = {k: {m: (v * 1e-6 if m != "spread" else v) for m, v in r.items()} for k, r in s.items()}
    print(f"status answer, {targets} targets: {rounds} interleaved rounds x {n} calls, ms/call")
    print_rows(ms, fmt="8.2f")
    base = s["built per call"]["median"]
    for arm in arms[1:]:
        print(f"  {arm} / built per call = {s[arm]['median'] / base:.3f}")
    ratio = s["verdicts kept"]["median"] / s["findings kept"]["median"]
    print(f"  verdicts kept / findings kept = {ratio:.3f}")


if __name__ == "__main__":
    main()
