"""The status answer for a run over many targets: building GetRunStatus's message, with the
findings' messages kept per finding (``wire.verdicts.finding_to_pb``) against built on every call.

The verifier keeps each (policy, target snapshot)'s findings between status calls
(``policy.engine.Judgements``), so the same finding objects come back call after call; their
protobuf messages (a JSON encoding of each context among them) were rebuilt every time, ~80 % of
a status call's CPU at 500 targets (cProfile). Arms, interleaved over ROUNDS rounds of N calls:
  built per call  every finding converted on every call (before)
  kept            a finding's message built once and reused while the finding is kept
Each call is what GetRunStatus does after its authorization: the evaluator's run verdict at
the current time and its conversion to the response message, serialized. Both arms' bytes are
checked equal first. Targets: TARGETS, one report each (API server, engine core, worker with a
hook), a policy requiring the hook. Prints ms per call, the ratio, the noise floor.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # tests' evidence builders
import _smoke
from _stats import interleaved_ns, print_rows

TARGETS = 500
ROUNDS = 15
N = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--targets", type=int, default=TARGETS)
    _smoke.add_args(parser)
    args = parser.parse_args()
    targets, rounds, n = args.targets, ROUNDS, N
    if args.smoke:
        _smoke.begin("both arms, 20 targets, 2 calls per round")
        targets, rounds, n = 20, _smoke.ROUNDS, 2

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.model import TargetReport
    from servewitness.policy import policy_digest
    from servewitness.server import clock
    from servewitness.server.evaluate import Evaluator
    from servewitness.server.store import Store
    from servewitness.wire import verdicts
    from tests.helpers import as_weak_as_needed
    from tests.test_policy_engine import HOOK_V1, api, engine, worker

    with tempfile.TemporaryDirectory() as d:
        ev = Evaluator(Store(Path(d) / "db.sqlite3"))
        policy = as_weak_as_needed(f"version = 1\n{HOOK_V1}[evidence]\nfreshness_s = 3600\n")
        run = ev.store.register_run("r", policy, policy_digest(policy), "bench")
        now = time.time()
        for i in range(targets):
            t = f"t{i}"
            report = TargetReport("a-" + t, t, 1, "", now, (api(), engine(), worker()))
            ev.note(report, now, "local", clock.boot_s())

        kept, built = verdicts.finding_to_pb, verdicts._finding_to_pb

        def answer(convert: object) -> bytes:
            verdicts.finding_to_pb = convert  # type: ignore[assignment]
            msg = wire.get_run_status_response_to_pb(ev.run_verdict(run, time.time()))
            return msg.SerializeToString()

        # The same answer either way (the times inside are the call's: compare without them).
        a, b = (
            wire.get_run_status_response_from_pb(pb.GetRunStatusResponse.FromString(answer(fn)))
            for fn in (built, kept)
        )
        same = [(t.target, t.verdict, t.findings) for t in a.targets] == [
            (t.target, t.verdict, t.findings) for t in b.targets
        ]
        print(f"the same answer from both arms: {same}")
        if not same:
            raise SystemExit(1)
        s = interleaved_ns(
            {"built per call": lambda: answer(built), "kept": lambda: answer(kept)}, rounds, n
        )
        verdicts.finding_to_pb = kept
        ms = {
            k: {m: (v * 1e-6 if m != "spread" else v) for m, v in r.items()} for k, r in s.items()
        }
        print(f"status answer, {targets} targets: {rounds} interleaved rounds x {n} calls, ms/call")
        print_rows(ms, fmt="8.2f")
        ratio = s["kept"]["median"] / s["built per call"]["median"]
        print(f"  kept / built per call = {ratio:.3f}")


if __name__ == "__main__":
    main()
