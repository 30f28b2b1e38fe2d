"""``verifier diff A B``: what changed between two boots (live processes or stored reports)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from servewitness._cli._local import load_side
from servewitness.evidence.procfs import ProcFS
from servewitness.model import HookEvidence, NativeMapping, ProcessReport

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
    native_added: list[dict[str, Any]] = field(default_factory=list)
    native_removed: list[dict[str, Any]] = field(default_factory=list)
    native_changed: list[dict[str, Any]] = field(default_factory=list)
    native_state: list[dict[str, Any]] = field(default_factory=list)
    distributions: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)
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
                self.native_added,
                self.native_removed,
                self.native_changed,
                self.native_state,
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
    _native(d, a, b)
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


def _native(d: Diff, a: ProcessReport, b: ProcessReport) -> None:
    """Native code by path: added, removed, other bytes of the mapped inode, or the same
    bytes whose path on disk changed state (replaced or deleted under the mapping)."""
    na = {n.path: n for n in a.native_mappings}
    nb = {n.path: n for n in b.native_mappings}
    for path in sorted(nb.keys() - na.keys()):
        d.native_added.append(_mapping(nb[path]))
    for path in sorted(na.keys() - nb.keys()):
        d.native_removed.append(_mapping(na[path]))
    for path in sorted(na.keys() & nb.keys()):
        x, y = na[path], nb[path]
        if x.sha256 != y.sha256:
            d.native_changed.append(
                {"path": path, "a": x.sha256, "b": y.sha256, "state_a": x.state, "state_b": y.state}
            )
        elif x.state != y.state:
            d.native_state.append({"path": path, "sha256": x.sha256, "a": x.state, "b": y.state})


def _mapping(n: NativeMapping) -> dict[str, Any]:
    return {"path": n.path, "sha256": n.sha256, "state": n.state}


def _hook_counts(h: HookEvidence | None, r: ProcessReport) -> dict[str, Any] | None:
    """A hook's fire counts with the step counts of its process beside them."""
    if h is None:
        return None
    s = r.steps
    return {
        "target": h.target,
        "fired": h.fired,
        "fired_productive": h.fired_productive,
        "fired_outside": h.fired_outside,
        "productive_steps": s.productive if s else 0,
        "total_steps": s.total if s else 0,
    }


def _hook_text(c: dict[str, Any] | None) -> str:
    if c is None:
        return "absent"
    return (
        f"fired {c['fired']} times, {c['fired_productive']} on {c['productive_steps']} "
        f"productive steps, {c['fired_outside']} outside steps ({c['total_steps']} steps in all)"
    )


def _hooks(a: ProcessReport, b: ProcessReport) -> list[dict[str, Any]]:
    """Hooks present in one side only, that fired in one and not the other, or whose target
    changed; each with its fired counts beside the step counts of both sides."""
    out = []
    ha = {h.name: h for h in a.hooks}
    hb = {h.name: h for h in b.hooks}
    for name in sorted(ha.keys() | hb.keys()):
        x, y = ha.get(name), hb.get(name)
        if x is not None and y is not None:
            if x.target != y.target:
                what = f"target {x.target or '-'} -> {y.target or '-'}"
            elif (x.fired > 0) != (y.fired > 0):
                what = "fired in A only" if x.fired > 0 else "fired in B only"
            else:
                continue
        else:
            what = "only in A" if y is None else "only in B"
        out.append({"name": name, "what": what, "a": _hook_counts(x, a), "b": _hook_counts(y, b)})
    return out


def _drift(x: Any) -> dict[str, Any]:
    return {"id": x.id, "path": x.path, "detail": x.detail}


def _native_lines(d: Diff) -> list[str]:
    lines = [f"native +   {x['path']}  {x['sha256'] or '-'}" for x in d.native_added]
    lines += [f"native -   {x['path']}  {x['sha256'] or '-'}" for x in d.native_removed]
    lines += [
        f"native     {x['path']}  {x['a'] or '-'} -> {x['b'] or '-'}" for x in d.native_changed
    ]
    lines += [f"native     {x['path']}  on disk: {x['a']} -> {x['b']}" for x in d.native_state]
    return lines


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
    lines += _native_lines(d)
    for x in d.distributions:
        lines.append(f"dist       {x['name']}  {x['a'] or 'absent'} -> {x['b'] or 'absent'}")
    for h in d.hooks:
        lines.append(
            f"hook       {h['name']}: {h['what']}; A: {_hook_text(h['a'])}; B: {_hook_text(h['b'])}"
        )
    for x in d.drift_added:
        lines.append(f"drift +    {x['id']}  {x['path']}")
    for x in d.drift_gone:
        lines.append(f"drift -    {x['id']}  {x['path']}")
    lines.append(
        f"{len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} with other bytes, "
        f"{len(d.origin)} with another origin; native code: {len(d.native_added)} added, "
        f"{len(d.native_removed)} removed, {len(d.native_changed)} with other bytes"
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
