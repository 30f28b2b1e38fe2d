"""``verifier inspect``: one-shot evidence for one process, or a vLLM process tree."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import structlog

from verifier.errors import UsageError
from verifier.evidence.process import ProcessEvidence, read_process, read_tree
from verifier.evidence.procfs import ProcFS

DESCRIPTION = """\
Read one live process (or, with --tree, it and every Python process under it) and print
what its in-process probe recorded next to what /proc shows: pid, start time, role, the live
model runner (class, the file defining its step method, that file's sha256), engine steps,
the hook table (every fire count with the process's step count beside it), the number of
loaded files and their manifest digest. A Python process without the probe is still
reported, with "probe absent"."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the evidence of one live process (or its process tree)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pid", type=int, required=True, help="process id to read")
    p.add_argument("--tree", action="store_true", help="also read every Python process under PID")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)  # tests: captured trees
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.pid <= 0:
        raise UsageError(f"--pid must be a positive integer, got {args.pid}")
    procfs = ProcFS(args.proc)
    evidence = read_tree(procfs, args.pid) if args.tree else [read_process(procfs, args.pid)]
    structlog.get_logger("verifier.inspect").info(
        "inspected",
        pid=args.pid,
        tree=args.tree,
        processes=len(evidence),
        probed=sum(e.probe is not None for e in evidence),
    )
    if args.json:
        json.dump({"processes": [e.as_dict() for e in evidence]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(evidence))
    return 0


def _short(sha: str | None) -> str:
    if not sha:
        return "-"
    return sha.removeprefix("sha256:")[:16]


def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def render(evidence: list[ProcessEvidence]) -> str:
    """Human-readable table, one block per process."""
    lines: list[str] = []
    for ev in evidence:
        d = ev.as_dict()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ev.identity.start_time))
        role = ev.role + (f" rank {ev.rank}" if ev.rank is not None else "")
        probe = f"probe {ev.probe.mode}" if ev.probe else "PROBE ABSENT"
        lines.append(f"pid {ev.identity.pid}  {role}  started {started}  {probe}")
        if ev.probe is None:
            lines.append(f"  {ev.note}")
            lines.append(f"  cmdline  {' '.join(ev.identity.cmdline)[:120]}")
            lines.append("")
            continue
        r = d["runner"]
        if r["class"]:
            lines.append(f"  runner   {r['class']}")
            lines.append(f"           step method in {r['file']}  sha256 {_short(r['sha256'])}")
        s = d["steps"]
        lines.append(
            f"  steps    total {s['total']}  productive {s['productive']}  empty {s['empty']}  "
            f"tokens {s['tokens_scheduled']}  max batch {s['requests_max']}"
        )
        m = d["manifest"]
        lines.append(
            f"  files    {m['files']} loaded  manifest {_short(m['digest'])}  {m['by_origin']}"
        )
        for err in d["probe"]["errors"]:
            lines.append(f"  probe error [{err['where']}] {err['msg']}")
        if d["hooks"]:
            header = (
                "hook",
                "target",
                "loaded",
                "instantiated",
                "fired",
                "steps",
                "on productive",
                "productive steps",
                "status",
            )
            rows = [header] + [
                (
                    h["name"],
                    h["target"] or "(api)",
                    _yn(h["module_loaded"]),
                    _yn(h["instantiated"]),
                    str(h["fired"]),
                    str(h["steps"]),
                    str(h["fired_on_productive_steps"]),
                    str(h["productive_steps"]),
                    h["status"],
                )
                for h in d["hooks"]
            ]
            widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
            for row in rows:
                lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
            for h in d["hooks"]:
                if h["status"] != "firing":
                    lines.append(f"    {h['name']}: {h['status']}: {h['why']}")
        lines.append("")
    return "\n".join(lines)
