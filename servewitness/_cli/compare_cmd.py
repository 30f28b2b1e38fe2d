"""``verifier sample`` (one boot's throughput from its probe's counters) and
``verifier compare`` (two arms of boots, with the noise floor)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from servewitness._cli.fmt import add_json, result
from servewitness.errors import CheckFailed, UsageError
from servewitness.evidence.journal import JournalCache
from servewitness.evidence.process import ProcessEvidence, read_process, read_tree
from servewitness.evidence.procfs import ProcFS
from servewitness.measure.compare import (
    CONFIDENCES,
    DEFAULT_CONFIDENCE,
    METRICS,
    as_dict,
    compare,
    load_sample,
    render,
    sample_values,
)


def add_parser(sub: Any) -> None:
    s = sub.add_parser(
        "sample",
        help="one boot's tokens/s and tokens/step over S seconds, from its probe's counters",
        description="Read the counters of the process that runs the model (in the tree of "
        "--pid: the worker of rank 0, else the engine core with the live runner) now and "
        "after --seconds, while a load runs, and write the difference: productive steps, "
        "tokens (prefill, decode), tokens/s, tokens/step, each hook's fires. Exit 1 when no "
        "step ran (no load: nothing to measure).",
    )
    s.add_argument("--pid", type=int, required=True, help="the vLLM server (its process tree)")
    s.add_argument("--seconds", type=float, required=True, help="how long to sample")
    s.add_argument("--out", required=True, metavar="FILE", help="where to write the sample")
    s.add_argument("--label", default="", help="free text kept in the sample (an arm's name)")
    s.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    add_json(s, "print the sample written to --out (with its path as out) as JSON")
    s.set_defaults(handler=run_sample)
    c = sub.add_parser(
        "compare",
        help="compare two arms of boots (samples) against their noise floor",
        description="Arm A is the samples before --vs, arm B those after. Samples of one boot "
        "are averaged into one value per boot. The difference is the ratio of the arms' "
        "geometric means; the noise floor is the smallest ratio a two-sided t test on the "
        "per-boot log values calls real at --confidence (pooled variance, boots - 2 degrees "
        "of freedom), so replicate boots of one configuration are called different in at "
        "most 1 - confidence of comparisons. With one boot in an arm the floor is unknown and "
        "is reported as such. Exit 0 (the comparison is the output).",
    )
    c.add_argument("a", nargs="+", metavar="A", help="samples of arm A")
    c.add_argument("--vs", nargs="+", required=True, metavar="B", help="samples of arm B")
    c.add_argument("--metric", choices=METRICS, action="append", help="default: all")
    c.add_argument(
        "--confidence",
        type=float,
        choices=CONFIDENCES,
        default=DEFAULT_CONFIDENCE,
        help=f"of the t test behind the noise floor (default {DEFAULT_CONFIDENCE})",
    )
    c.add_argument("--json", action="store_true", help="print the comparisons as JSON")
    c.set_defaults(handler=run_compare)


class NothingMeasured(CheckFailed):
    """No step ran in a sample: there is nothing to measure."""


def _stepper(procfs: ProcFS, pid: int) -> ProcessEvidence:
    procs = [p for p in read_tree(procfs, pid) if p.probe is not None]
    workers = sorted(
        (p for p in procs if p.role == "worker"), key=lambda p: (p.rank or 0, p.identity.pid)
    )
    if workers:
        return workers[0]
    with_runner = [p for p in procs if p.probe is not None and p.probe.runner is not None]
    if with_runner:
        return with_runner[0]
    raise UsageError(f"pid {pid}: no probed process in its tree runs the model")


def run_sample(args: argparse.Namespace) -> int:
    if args.pid <= 0 or args.seconds <= 0:
        raise UsageError("--pid and --seconds must be positive")
    procfs = ProcFS(args.proc)
    pid = _stepper(procfs, args.pid).identity.pid
    # Parse the stepper's journal once here, so that the two reads that bracket the interval
    # only re-read its counters (milliseconds, even on a machine the load keeps busy): the
    # interval is then the time between the two counter reads, not a journal parse longer.
    cache = JournalCache()
    read_process(procfs, pid, cache)
    first = read_process(procfs, pid, cache)
    t0 = time.monotonic()
    time.sleep(args.seconds)
    last = read_process(procfs, pid, cache)
    seconds = time.monotonic() - t0
    if first.probe is None or last.probe is None:
        raise UsageError(f"pid {first.identity.pid}: its probe state went away")
    s0, s1 = first.probe.steps, last.probe.steps
    steps = s1.productive - s0.productive
    tokens = s1.tokens_scheduled - s0.tokens_scheduled
    decode = s1.decode_tokens - s0.decode_tokens
    if steps <= 0:
        raise NothingMeasured(
            f"no productive step ran in pid {first.identity.pid} during {seconds:.1f} s: "
            "was the load running?"
        )
    h0 = {h.name: h.fired for h in first.probe.hooks}
    ident = first.identity
    body = {
        "sample": 1,
        "label": args.label,
        "boot": f"{ident.boot_id}/{ident.pid}/{ident.start_ticks}",
        "pid": ident.pid,
        "role": first.role,
        "rank": first.rank,
        "seconds": seconds,
        "productive_steps": steps,
        "tokens": tokens,
        "prefill_tokens": s1.prefill_tokens - s0.prefill_tokens,
        "decode_tokens": decode,
        "hooks": {h.name: h.fired - h0.get(h.name, 0) for h in last.probe.hooks},
        **sample_values(steps, tokens, decode, seconds),
    }
    Path(args.out).write_text(json.dumps(body, indent=2) + "\n")
    line = (
        f"pid {ident.pid} ({first.role}): {steps} productive steps, {tokens} tokens in "
        f"{seconds:.1f} s: {body['tokens_per_s']:.1f} tokens/s, "
        f"{body['tokens_per_step']:.2f} tokens/step"
    )
    result(args, {"out": args.out, **body}, [line])
    return 0


def run_compare(args: argparse.Namespace) -> int:
    a = [load_sample(Path(p)) for p in args.a]
    b = [load_sample(Path(p)) for p in args.vs]
    results = [compare(a, b, m, args.confidence) for m in args.metric or METRICS]
    if args.json:
        json.dump({"comparisons": [as_dict(c) for c in results]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n".join(render(c) for c in results) + "\n")
    return 0
