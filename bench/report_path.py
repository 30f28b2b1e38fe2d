"""The verifier's Report path in one process, gRPC taken out: CPU per acknowledged report.

Why: the service-level benchmark (``agents_scale.py``) runs a gRPC server, a load generator
and the status client on the same two cores; its floor (8-17 % on CPU per report, rounds of
one arm) is wider than the changes it must price (a few % each). This one calls
``VerifierService.Report`` directly, as gRPC's worker threads do, so what it measures is the
servicer's work alone: conversion, checks, the group-committed SQLite transaction (ledger,
index, bindings), metrics and the evaluator's note.

Method. Every arm is a source tree (``--src LABEL=PATH``; the first is the baseline) run in a
child process of its own per round, the arms' order rotated per round. A child builds a
fresh store (SQLite, ``synchronous=FULL``) and service, says Hello and sends one full report
(the worker's manifest) for each of AGENTS agents, untimed; then THREADS threads send REPORTS
reports per agent, each request a pre-serialized ``ReportRequest`` (20 request bindings) parsed
with ``FromString`` as gRPC's deserializer would, and the child's CPU time (every thread,
``time.process_time``) is divided by the reports acknowledged. The same child first times the
floor: the same requests parsed and a ``ReportResponse`` serialized, nothing else (what any
servicer pays). Rows: CPU ms per report per arm over the rounds (median, min, max, spread:
the noise floor), the floor's row, each arm's ratio to the baseline paired per round; then,
for trees that count it (``Store.write_times``), the write lock's wall time held per report
(statements and commit: what several verifier processes on one database serialize on) and
the reports per transaction, with the same ratios. Last, the conversions alone (the request
converted, its bindings made the store's rows, digests and counts, its stored body made, each
as that tree's ``Report`` and ``_ingest`` make them, the body read back as a follower reads
it), single-threaded, best of three passes: their floor is a few percent where
the whole path's (threads, SQLite's fsync) is 10-50 % on a shared VM, so a change to the
conversions is priced there (``convert_cpu``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _smoke
from _stats import print_rows, summary

REPO = Path(__file__).resolve().parent.parent


class _Context:
    """What the servicer reads of a gRPC context: an insecure TCP peer, the agent's
    metadata; an abort raises (a refused report fails the benchmark)."""

    def __init__(self, metadata: Any) -> None:
        self.metadata = metadata

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def auth_context(self) -> dict[str, Any]:
        return {}

    def invocation_metadata(self) -> Any:
        return self.metadata

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"refused: {code}: {details}")

    def is_active(self) -> bool:
        return True


def _ready(d: Path, agents: int) -> tuple[Any, Any, list[list[Any]]]:
    """A fresh store and service in D, and AGENTS agents that said Hello and had their first
    report (the full manifest) acknowledged: [agent id, context, nonce] each."""
    from load_test import POLICY, report

    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb
    from servewitness.policy import policy_digest
    from servewitness.server.service import VerifierService
    from servewitness.server.store import Store

    store = Store(d / "verifier.sqlite3")
    svc = VerifierService(store)
    store.register_run("load", POLICY, policy_digest(POLICY), "bench")
    state: list[list[Any]] = []
    for n in range(agents):
        aid = f"a{n}"
        ctx: Any = _Context(wire.agent_metadata(aid, ["t-" + aid]))  # as gRPC gives it
        nonce = svc.Hello(pb.HelloRequest(agent_id=aid, targets=["t-" + aid]), ctx).nonce
        full = pb.ReportRequest(report=wire.report_to_pb(report(aid, n, 1, 20, True)))
        full.report.nonce = nonce
        ack = svc.Report(full, ctx)
        if not ack.accepted:
            raise SystemExit(f"agent {aid}: its first report was not accepted")
        state.append([aid, ctx, ack.nonce])
    return store, svc, state


def child(agents: int, reports: int, threads: int) -> None:
    """One arm's measurement, in the source tree on sys.path: prints 'floor MS' and 'cpu MS'."""
    from load_test import report

    from servewitness import wire
    from servewitness._logging import configure
    from servewitness.api.v1 import verifier_pb2 as pb

    configure(0)
    with tempfile.TemporaryDirectory(prefix="report-path-") as d:
        store, svc, state = _ready(Path(d), agents)
        blobs: list[tuple[list[Any], bytes]] = []
        for i in range(reports):
            for n, a in enumerate(state):
                req = pb.ReportRequest(report=wire.report_to_pb(report(a[0], n, 2 + i, 20, False)))
                blobs.append((a, req.SerializeToString()))
        ok = pb.ReportResponse(accepted=True, seq=1, nonce="0" * 32)
        c0 = time.process_time()
        for _, blob in blobs:  # the floor: what gRPC's (de)serializers cost any servicer
            pb.ReportRequest.FromString(blob)
            ok.SerializeToString()
        floor = time.process_time() - c0
        lock, it = threading.Lock(), iter(blobs)

        def run() -> None:
            while True:
                with lock:
                    nxt = next(it, None)
                if nxt is None:
                    return
                a, blob = nxt
                req = pb.ReportRequest.FromString(blob)
                req.report.nonce = a[2]  # the nonce the last acknowledgement gave
                ack = svc.Report(req, a[1])
                if not ack.accepted:
                    raise SystemExit(f"agent {a[0]}: report {req.report.seq} not accepted")
                ack.SerializeToString()
                a[2] = ack.nonce

        pool = [threading.Thread(target=run) for _ in range(threads)]
        tx0, _, held0 = store.write_times()
        c0 = time.process_time()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        cpu = time.process_time() - c0
        tx1, _, held1 = store.write_times()
        stored = store.count_reports()
        if stored != agents * (reports + 1):
            raise SystemExit(f"{stored} reports stored, {agents * (reports + 1)} sent")
        print(f"floor {floor / len(blobs) * 1e3:.4f}")
        print(f"cpu {cpu / len(blobs) * 1e3:.4f}")
        # the write lock: held per report (wall), and reports per transaction
        print(f"held {(held1 - held0) / len(blobs) * 1e3:.4f}")
        print(f"per_tx {len(blobs) / max(1, tx1 - tx0):.3f}")
        print(f"convert {convert_cpu(blobs) * 1e3:.4f}")


def _stored_body(report: Any, msg: Any) -> bytes:
    """The stored body as this tree's ``VerifierService._ingest`` makes it: cut from the
    message (``wire.stored_bytes``), or, in a tree from before it, the stripped conversion
    encoded again (what ``_ingest`` did then, reproduced here)."""
    import dataclasses

    from servewitness import wire

    cut = getattr(wire, "stored_bytes", None)
    if cut is not None:
        return bytes(cut(msg))
    procs = tuple(dataclasses.replace(p, files=None) for p in report.processes)
    bare = dataclasses.replace(report, processes=procs, spans=(), request_ids=())
    return bytes(wire.report_to_bytes(bare))


def _converted(req: Any) -> Any:
    """REQ converted, and its bindings made the store's rows with their digests and request
    counts, as this tree's ``VerifierService.Report`` and ``report_rows.prepare`` make them:
    straight from the message where the tree has ``tails_from_pb`` (``server/binding_rows.py``,
    or ``ledger.bindings`` at a38e502), else from the converted objects. The report,
    converted."""
    from servewitness import wire
    from servewitness.ledger import bindings
    from servewitness.server import index

    tails_from_pb: Any
    try:
        from servewitness.server.binding_rows import tails_from_pb
    except ImportError:  # an older tree
        tails_from_pb = getattr(bindings, "tails_from_pb", None)
    if tails_from_pb is not None:
        report = wire.report_request_from_pb(req, bindings=False)
        tails = tails_from_pb(req.report)
        bindings.prepare_tails("ref", report.target, tails, 1.0)
        index.request_counts(report.target, tails.spans)
        return report
    report = wire.report_request_from_pb(req)
    bindings.prepare_batch("ref", report.target, report.spans, report.request_ids, 1.0)
    index.request_counts(report.target, report.spans)  # type: ignore[arg-type]  # older trees
    return report


def convert_cpu(blobs: list[tuple[list[Any], bytes]], passes: int = 3) -> float:
    """CPU seconds per report of the conversions alone, single-threaded, best of PASSES over
    BLOBS: the receiver's (request parsed, converted, its bindings made rows with their
    digests, its stored body made) and a follower's (the stored body read back), what a
    serving process converts per report it receives and per report another process stored.
    No store, no threads: a floor in the 1-3 % range where the whole path's is 10-50 % on
    this machine."""
    from servewitness import wire
    from servewitness.api.v1 import verifier_pb2 as pb

    best = math.inf
    for _ in range(passes):
        c0 = time.process_time()
        for _, blob in blobs:
            req = pb.ReportRequest.FromString(blob)
            report = _converted(req)
            wire.report_from_bytes(_stored_body(report, req.report))
        best = min(best, time.process_time() - c0)
    return best / len(blobs)


def arm(src: Path, agents: int, reports: int, threads: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{src / 'probe'}"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(agents), str(reports), str(threads)],
        env=env, cwd=src, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"arm {src} failed:\n{out.stdout}\n{out.stderr}")
    keys = ("floor", "cpu", "held", "per_tx", "convert")
    got = {
        k: float(v)
        for k, v in (line.split() for line in out.stdout.splitlines() if len(line.split()) == 2)
        if k in keys
    }
    got.setdefault("held", float("nan"))  # a tree from before Store.write_times
    got.setdefault("per_tx", float("nan"))
    return got


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*(int(v) for v in sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--reports", type=int, default=5, help="reports per agent, timed")
    ap.add_argument("--threads", type=int, default=8, help="as the agents' gRPC workers")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--src", action="append", default=[], help="LABEL=PATH of a source tree")
    _smoke.add_args(ap)
    args = ap.parse_args()
    if args.smoke:
        _smoke.begin("two arms of this tree, 4 agents x 2 reports, 2 threads",
                     ["the default sizes (200 agents: group commit's batches)"])  # fmt: skip
        args.agents, args.reports, args.threads, args.rounds = 4, 2, 2, _smoke.ROUNDS
        args.src = []
    srcs = [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in args.src] or [
        ("this tree", REPO),
        ("this tree again", REPO),
    ]
    print(f"Report path in one process: {args.agents} agents x {args.reports} reports, "
          f"{args.threads} threads, {args.rounds} rounds, arms interleaved, baseline "
          f"{srcs[0][0]}", flush=True)  # fmt: skip
    cpu: dict[str, list[float]] = {label: [] for label, _ in srcs}
    held: dict[str, list[float]] = {label: [] for label, _ in srcs}
    per_tx: dict[str, list[float]] = {label: [] for label, _ in srcs}
    convert: dict[str, list[float]] = {label: [] for label, _ in srcs}
    floors: list[float] = []
    for r in range(args.rounds):
        order = [*srcs[r % len(srcs) :], *srcs[: r % len(srcs)]]
        for label, src in order:
            got = arm(src, args.agents, args.reports, args.threads)
            cpu[label].append(got["cpu"])
            held[label].append(got["held"])
            per_tx[label].append(got["per_tx"])
            convert[label].append(got["convert"])
            floors.append(got["floor"])
            print(f"  round {r} {label}: {got['cpu']:.3f} ms CPU per report (floor "
                  f"{got['floor']:.4f} ms), write lock held {got['held']:.3f} ms per report, "
                  f"{got['per_tx']:.2f} reports per transaction, conversions "
                  f"{got['convert']:.4f} ms", flush=True)  # fmt: skip
    print("CPU ms per acknowledged report, over the rounds:")
    print_rows({**{k: summary(v) for k, v in cpu.items()}, "floor": summary(floors)}, "8.4f")
    if not any(math.isnan(v) for vs in held.values() for v in vs):
        print("Write lock held per report, ms (wall: statements and commit), over the rounds:")
        print_rows({k: summary(v) for k, v in held.items()}, "8.4f")
        print("Reports per transaction, over the rounds:")
        print_rows({k: summary(v) for k, v in per_tx.items()}, "8.3f")
    print("Conversions per report, ms CPU (received + stored body + read back), over the rounds:")
    print_rows({k: summary(v) for k, v in convert.items()}, "8.4f")
    base = cpu[srcs[0][0]]
    for label, _ in srcs[1:]:
        paired = statistics.median(
            a / b for a, b in zip(convert[label], convert[srcs[0][0]], strict=True)
        )
        print(f"  {label} / {srcs[0][0]} = {paired:.3f} (conversions, paired per round, median)")
        paired = statistics.median(a / b for a, b in zip(cpu[label], base, strict=True))
        print(f"  {label} / {srcs[0][0]} = {paired:.3f} (CPU, paired per round, median)")
        hb, hl = held[srcs[0][0]], held[label]
        if not any(math.isnan(v) for v in (*hb, *hl)):
            paired = statistics.median(a / b for a, b in zip(hl, hb, strict=True))
            print(f"  {label} / {srcs[0][0]} = {paired:.3f} (write lock held, paired, median)")
    print(f"  {srcs[0][0]} / floor = {statistics.median(base) / statistics.median(floors):.1f}")


if __name__ == "__main__":
    main()
