"""``verifier diff A B``: what changed between two boots (live processes or stored reports)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from verifier._cli._local import load_side
from verifier.evidence.procfs import ProcFS
from verifier.model import ProcessReport

DESCRIPTION = """\
Compare what two processes run: each side is a pid (its process tree is read now, as
`verifier inspect --tree` does) or a file written by `verifier inspect --json`. From a tree
the process that runs the model stands for it (a worker, else the engine core with the live
runner), or the one with --role. Lists the files added, removed or with other bytes, files
whose provenance class changed (pristine, patched, editable, generated, stdlib, unknown),
distributions whose version changed, a different live runner, different hooks, and drift
findings that appeared or went away. Exit code 0: no difference; 1: differences."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "diff",
        help="what changed between two boots (pids or stored `inspect --json` reports)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("a", metavar="A", help="pid or `verifier inspect --json` file (the before)")
    p.add_argument("b", metavar="B", help="pid or `verifier inspect --json` file (the after)")
    p.add_argument(
        "--role",
        choices=("api_server", "engine_core", "worker"),
        help="compare the processes of this role (default: the one that runs the model)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


@dataclass
class Diff:
    a: str
    b: str
    runner: list[str] = field(default_factory=list)
    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    changed: list[dict[str, Any]] = field(default_factory=list)
    origin: list[dict[str, Any]] = field(default_factory=list)
    distributions: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    drift_added: list[dict[str, Any]] = field(default_factory=list)
    drift_gone: list[dict[str, Any]] = field(default_factory=list)

    def empty(self) -> bool:
        return not any(
            (
                self.runner,
                self.added,
                self.removed,
                self.changed,
                self.origin,
                self.distributions,
                self.hooks,
                self.drift_added,
                self.drift_gone,
            )
        )


def _origins(r: ProcessReport) -> dict[str, str]:
    """Listed (non-pristine) files' classes; files not listed are pristine or stdlib."""
    return {f.path: f.origin for f in r.provenance.files} if r.provenance else {}


def compare(label_a: str, a: ProcessReport, label_b: str, b: ProcessReport) -> Diff:
    d = Diff(label_a, label_b)
    ra, rb = a.runner, b.runner
    if (ra and ra.cls) != (rb and rb.cls):
        d.runner.append(f"class {ra.cls if ra else None} -> {rb.cls if rb else None}")
    if ra and rb and (ra.file, ra.sha256) != (rb.file, rb.sha256):
        d.runner.append(f"step file {ra.file} {ra.sha256} -> {rb.file} {rb.sha256}")
    fa = {f.path: f for f in a.files or ()}
    fb = {f.path: f for f in b.files or ()}
    for path in sorted(fb.keys() - fa.keys()):
        d.added.append({"path": path, "sha256": fb[path].sha256, "kind": fb[path].kind})
    for path in sorted(fa.keys() - fb.keys()):
        d.removed.append({"path": path, "sha256": fa[path].sha256, "kind": fa[path].kind})
    for path in sorted(fa.keys() & fb.keys()):
        if fa[path].sha256 != fb[path].sha256:
            d.changed.append({"path": path, "a": fa[path].sha256, "b": fb[path].sha256})
    oa, ob = _origins(a), _origins(b)
    for path in sorted((oa.keys() | ob.keys()) & fa.keys() & fb.keys()):
        before, after = oa.get(path, "pristine/stdlib"), ob.get(path, "pristine/stdlib")
        if before != after:
            d.origin.append({"path": path, "a": before, "b": after})
    da = {n: v for n, v, _ in (a.provenance.distributions if a.provenance else ())}
    db = {n: v for n, v, _ in (b.provenance.distributions if b.provenance else ())}
    for name in sorted(da.keys() | db.keys()):
        if da.get(name) != db.get(name):
            d.distributions.append({"name": name, "a": da.get(name), "b": db.get(name)})
    d.hooks = _hooks(a, b)
    ka = {(x.id, x.path): x for x in a.drift}
    kb = {(x.id, x.path): x for x in b.drift}
    d.drift_added = [_drift(kb[k]) for k in sorted(kb.keys() - ka.keys())]
    d.drift_gone = [_drift(ka[k]) for k in sorted(ka.keys() - kb.keys())]
    return d


def _hooks(a: ProcessReport, b: ProcessReport) -> list[str]:
    out = []
    ha = {h.name: (h.target, h.fired > 0) for h in a.hooks}
    hb = {h.name: (h.target, h.fired > 0) for h in b.hooks}
    for name in sorted(ha.keys() | hb.keys()):
        if name not in hb:
            out.append(f"{name}: only in A")
        elif name not in ha:
            out.append(f"{name}: only in B")
        elif ha[name] != hb[name]:
            fired = {True: "fired", False: "never fired"}
            out.append(f"{name}: {fired[ha[name][1]]} in A, {fired[hb[name][1]]} in B")
    return out


def _drift(x: Any) -> dict[str, Any]:
    return {"id": x.id, "path": x.path, "detail": x.detail}


def render(d: Diff) -> str:
    lines = [f"A: {d.a}", f"B: {d.b}"]
    if d.empty():
        lines.append("no difference")
        return "\n".join(lines) + "\n"
    for r in d.runner:
        lines.append(f"runner     {r}")
    for x in d.added:
        lines.append(f"added      {x['path']}  {x['sha256'] or '-'}")
    for x in d.removed:
        lines.append(f"removed    {x['path']}  {x['sha256'] or '-'}")
    for x in d.changed:
        lines.append(f"bytes      {x['path']}  {x['a'] or '-'} -> {x['b'] or '-'}")
    for x in d.origin:
        lines.append(f"origin     {x['path']}  {x['a']} -> {x['b']}")
    for x in d.distributions:
        lines.append(f"dist       {x['name']}  {x['a'] or 'absent'} -> {x['b'] or 'absent'}")
    for h in d.hooks:
        lines.append(f"hook       {h}")
    for x in d.drift_added:
        lines.append(f"drift +    {x['id']}  {x['path']}")
    for x in d.drift_gone:
        lines.append(f"drift -    {x['id']}  {x['path']}")
    lines.append(
        f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} with other bytes, "
        f"{len(d.origin)} with another origin"
    )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    procfs = ProcFS(args.proc)
    label_a, a = load_side(args.a, args.role, procfs)
    label_b, b = load_side(args.b, args.role, procfs)
    d = compare(label_a, a, label_b, b)
    if args.json:
        json.dump({**d.__dict__, "same": d.empty()}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(d))
    return 0 if d.empty() else 1
