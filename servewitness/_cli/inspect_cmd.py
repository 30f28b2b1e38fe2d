"""``verifier inspect``: one-shot evidence for one process, or a vLLM process tree."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import structlog

from servewitness import wire
from servewitness._cli import selffiles
from servewitness._cli._local import read_local
from servewitness._cli.fmt import dumps
from servewitness._cli.fmt import wrap_lines as wrap
from servewitness.errors import UsageError
from servewitness.evidence.process import ProcessEvidence, tree_notes
from servewitness.evidence.procfs import ProcFS
from servewitness.model import DRIFT_CHANGED_IN_CACHE, ProcessReport

DESCRIPTION = """\
Read one live process (or, with --tree, it and every Python process under it) and print
what its in-process probe recorded next to what /proc shows: pid, start time, role, the live
model runner (class, the file defining its step method, that file's sha256), engine steps,
the hook table (every fire count with the process's step count beside it), the number of
loaded files and their manifest digest. Then what this tool judges from outside the process,
as the agent does: files per provenance class (pristine, patched, editable, generated, stdlib,
unknown, added; native libraries of a distribution included, judged as mapped) with every
file that is not pristine and why, what runs each step method of the live runner and
worker and each declared hook target (every layer, outermost first: file, first line, a
digest of its code, checked against its file: verified, patched or unverified), drift (stale
bytecode, shadowed modules, files modified after load or changed after the process started,
code that is not its file's definition, ...), the files hashed after the fact, native
libraries replaced, deleted or rewritten in place while mapped, and files the probe and
/proc disagree on. A Python process without the probe is still
reported, with "probe absent".

--json output is also a stored report: `verifier diff` and `verifier policy init` read it
(each process's "report" key)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the evidence of one live process (or its process tree)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--pid", type=int, required=True, help="process id to read")
    p.add_argument("--tree", action="store_true", help="also read every Python process under PID")
    p.add_argument(
        "--json", action="store_true", help="print JSON instead of tables (every file kept)"
    )
    p.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)  # tests: captured trees
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.pid <= 0:
        raise UsageError(f"--pid must be a positive integer, got {args.pid}")
    procfs = ProcFS(args.proc)
    pairs = read_local(procfs, args.pid, args.tree)
    evidence = [ev for ev, _ in pairs]
    structlog.get_logger("verifier.inspect").info(
        "inspected",
        pid=args.pid,
        tree=args.tree,
        processes=len(evidence),
        probed=sum(e.probe is not None for e in evidence),
    )
    notes, requests = tree_notes(evidence)
    if args.json:
        out = [{**ev.as_dict(), **judged_dict(r)} for ev, r in pairs]
        doc = {"processes": out, "notes": notes, "requests": requests}
        sys.stdout.write(dumps(doc) + "\n")
    else:
        sys.stdout.write(render(pairs, verbose=args.verbose > 0))
        text = [
            f"requests bound to steps {requests['bound']}, with a front-end id "
            f"{requests['ext']}, with a client id {requests['client']}"
        ]
        sys.stdout.write("".join(f"{n}\n" for n in wrap([f"NOTE {n}" for n in [*notes, *text]])))
    return 0


def judged_dict(r: ProcessReport) -> dict[str, Any]:
    """The agent-side judgement for JSON readers, and the whole report (a stored report)."""
    prov = r.provenance
    return {
        "provenance": None
        if prov is None
        else {
            "counts": dict(prov.counts),
            "distributions": [
                {"name": n, "version": v, "files": k} for n, v, k in prov.distributions
            ],
            "files": [dataclasses.asdict(f) for f in prov.files],
        },
        "drift": [dataclasses.asdict(d) for d in r.drift],
        # each chain with the agent's verdict: status, and each layer's check
        "code": [dataclasses.asdict(c) for c in r.code],
        "disagreements": [dataclasses.asdict(d) for d in r.disagreements],
        "native": [dataclasses.asdict(n) for n in r.native_mappings],
        "report": wire.process_to_json(r),
    }


def _short(sha: str | None) -> str:
    if not sha:
        return "-"
    return sha.removeprefix("sha256:")[:16]


def _yn(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def _speculation_lines(sp: dict[str, Any] | None) -> list[str]:
    """The speculation line of a process that runs steps (none before its runner exists)."""
    if sp is None:
        return []
    if sp["on"] is None:
        return ["  spec     config not readable"]
    if not sp["on"]:
        return ["  spec     off"]
    rate = sp["acceptance_rate"]
    return [
        f"  spec     {sp['method']}  k {sp['num_speculative_tokens']}  steps {sp['steps']}  "
        f"drafts {sp['drafts']}  draft tokens {sp['draft_tokens']}  accepted "
        f"{sp['accepted_tokens']} ({'-' if rate is None else f'{rate:.0%}'})  per position "
        f"{'/'.join(str(n) for n in sp['accepted_per_position'])}  emitted {sp['emitted_tokens']}"
        + (f"  unread steps {sp['unread_steps']}" if sp["unread_steps"] else "")
    ]


def _note_lines(d: dict[str, Any]) -> list[str]:
    """Where a process's evidence is weaker than a server's, and why its journal cannot be
    trusted (evidence.journal.edited)."""
    notes = [f"  NOTE     {note}" for note in d["notes"]]
    return notes + [f"  JOURNAL EDITED  {x}" for x in d["probe"]["journal_problems"]]


def _v(x: object) -> str:
    """A recorded value for a table: "-" where none was recorded."""
    return "-" if x is None else str(x)


def _counts(by: dict[str, int]) -> str:
    return "  ".join(f"{k} {v}" for k, v in by.items())


def _cut(s: str, n: int) -> str:
    """S in at most N characters: the end replaced by an ellipsis when longer."""
    return s if len(s) <= n else s[: n - 1] + "…"


HOOK_HEADER = (
    "hook", "status", "loaded", "inst.", "fired", "steps", "productive", "decode", "outside"
)  # fmt: skip


def hook_table(hooks: list[dict[str, Any]], decode_steps: int) -> list[str]:
    """One row per hook (fits 100 columns: names cut at 24 characters), then each hook's
    target on a line of its own; "productive" and "decode" are fires/steps."""
    rows = [HOOK_HEADER] + [
        (
            _cut(h["name"], 24),
            _cut(h["status"], 18),
            _yn(h["module_loaded"]),
            _yn(h["instantiated"]),
            str(h["fired"]),
            str(h["steps"]),
            f"{h['fired_on_productive_steps']}/{h['productive_steps']}",
            f"{h['fired_on_decode_steps']}/{decode_steps}",
            str(h["fired_outside_steps"]),
        )
        for h in hooks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HOOK_HEADER))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]  # fmt: skip
    lines += [f"    {h['name']}: target {h['target'] or '(api)'}" for h in hooks]
    return lines


def render(pairs: list[tuple[ProcessEvidence, ProcessReport]], verbose: bool = False) -> str:
    """Human-readable table, one block per process; VERBOSE: every file listed (this tool's
    own are otherwise one "self" line)."""
    lines: list[str] = []
    for ev, report in pairs:
        d = ev.as_dict()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ev.identity.start_time))
        role = ev.role + (f" rank {ev.rank}" if ev.rank is not None else "")
        probe = f"probe {ev.probe.mode}" if ev.probe else "PROBE ABSENT"
        lines.append(f"pid {ev.identity.pid}  {role}  started {started}  {probe}")
        if ev.probe is None:
            lines.append(f"  {ev.note}")
            cmdline = " ".join(ev.identity.cmdline)
            lines.append(f"  cmdline  {cmdline if verbose else _cut(cmdline, 88)}")
            lines.append("")
            continue
        lines.extend(_note_lines(d))
        e = d["engine"]
        if e:
            lines.append(
                f"  engine   async scheduling {e['async_scheduling']}  batch queue "
                f"{e['batch_queue']}  step {e['step']}"
            )
        r = d["runner"]
        if r["class"]:
            lines.append(f"  runner   {r['class']}")
            lines.append(f"           step method in {r['file']}  sha256 {_short(r['sha256'])}")
        s = d["steps"]
        lines.append(
            f"  steps    total {s['total']}  productive {s['productive']}  empty {s['empty']}  "
            f"tokens {s['tokens_scheduled']}  max batch {s['requests_max']}"
        )
        g = s["graph"]
        lines.append(
            f"           prefill {s['prefill']} ({s['prefill_tokens']} tokens)  decode "
            f"{s['decode']} ({s['decode_tokens']} tokens)  dummy {s['dummy']}"
            + (f"  raised {s['raised']}" if s.get("raised") else "")
        )
        lines.append(
            f"  graph    eager {_v(g.get('enforce_eager'))}  compilation "
            f"{_v(g.get('compilation_mode'))}  cudagraphs {_v(g.get('cudagraph_mode'))}"
            if g
            else "  graph    mode not recorded"
        )
        lines.extend(_speculation_lines(s["speculation"]))
        for x in r["log"]:
            lines.append(_cut(f"  vllm log {x['level']} {x['logger']}: {x['message']}", 100))
        m = d["manifest"]
        lines.append(
            f"  files    {m['files']} loaded  manifest {_short(m['digest'])}  "
            f"{_counts(m['by_origin'])}"
        )
        for err in d["probe"]["errors"]:
            lines.append(f"  probe error [{err['where']}] {err['msg']}")
        if d["hooks"]:
            lines.extend(hook_table(d["hooks"], s["decode"]))
            for h in d["hooks"]:
                if h["status"] != "firing":
                    lines.append(f"    {h['name']}: {h['status']}: {h['why']}")
                if h.get("device_fired") is not None:
                    lines.append(f"    {h['name']}: {_device_line(h, s['productive'])}")
        lines.extend(render_judgement(report, verbose))
        lines.append("")
    return "\n".join(wrap(lines))


def render_judgement(r: ProcessReport, verbose: bool = True) -> list[str]:
    """Provenance classes, every file that is not pristine (this tool's own in one line unless
    VERBOSE), drift, native libraries and disagreements, as the agent judges them."""
    lines = []
    prov = r.provenance
    if prov is not None:
        counts = "  ".join(f"{o} {n}" for o, n in prov.counts)
        lines.append(f"  origin   {counts}")
        shown = list(prov.files)
        if not verbose:
            parts = selffiles.split([dataclasses.asdict(f) for f in prov.files])
            own = {x["path"] for x in parts.own}
            shown = [f for f in prov.files if f.path not in own]
            if own:
                lines.append(
                    f"    self      {len(own)} files of this tool, digest {parts.digest()} "
                    "(-v lists them)"
                )
        for f in shown:
            dist = f" [{f.distribution} {f.version}]" if f.distribution else ""
            lines.append(f"    {f.origin:<9} {f.path}{dist}: {f.reason}")
    lines.extend(render_code(r))
    waived = [d for d in r.drift if d.id == DRIFT_CHANGED_IN_CACHE]
    for d in r.drift:
        if d.id != DRIFT_CHANGED_IN_CACHE:
            lines.append(f"  DRIFT    {d.id}: {d.detail}")
    if waived:
        lines.append(
            f"  cache    {len(waived)} files hashed after the fact changed after the start under "
            "the process's caches or temporary directories (INFO, not judged), e.g."
        )
        lines.extend(f"    {d.path}" for d in waived[: len(waived) if verbose else 5])
    if r.hashed_after_count:
        lines.append(
            f"  after    {r.hashed_after_count} files hashed after the fact (imported before the "
            "probe started, or outside the import system), e.g."
        )
        lines.extend(f"    {path}" for path in r.hashed_after[:5])
    bad = [n for n in r.native_mappings if n.state != "same"]
    lines.append(
        f"  native   {len(r.native_mappings)} executable mappings, {len(bad)} not as on disk"
    )
    for n in bad:
        why = f" ({n.error or n.detail})" if n.error or n.detail else ""
        lines.append(f"    {n.state:<9} {n.path}  dev {n.device} inode {n.inode}{why}")
    for g in r.disagreements:
        lines.append(
            f"  DISAGREE {g.path}: {g.reason} (probe {_short(g.sha256_in_process)}, "
            f"agent {_short(g.sha256_agent)})"
        )
    return lines


def render_code(r: ProcessReport) -> list[str]:
    """What runs each step method and hook target: one line per chain with its status, then
    one per layer (outermost first) with where its code comes from and its check."""
    lines = []
    for c in r.code:
        on = " (on the live object)" if c.via == "instance" else ""
        probe = f", {c.probe_layers} probe wrapper(s) left out" if c.probe_layers else ""
        changed = f", changed {c.changes - 1} time(s)" if c.changes > 1 else ""
        dist = f" [{c.distribution}]" if c.distribution else ""
        lines.append(
            f"  code     {c.subject}{on}: {c.owner}.{c.attr}{dist} "
            f"{(c.status or 'unjudged').upper()}{probe}{changed}"
        )
        for i, x in enumerate(c.layers):
            where = f"{x.file}:{x.line}" if x.file else "(no Python code)"
            sha = f" {_short(x.sha256)}" if x.sha256 else ""
            lines.append(
                f"    {i} {x.kind:<9} {x.code_qualname or x.qualname or '?'} {where}{sha}"
                + (f"  {x.check}" if x.check else "")
                + (f": {x.detail}" if x.detail else "")
            )
    return lines


def _device_line(h: dict[str, Any], productive: int) -> str:
    """A hook's device counter, with the steps it is to be read against."""
    head = (
        f"device counter on {h.get('device')}: {h['device_fired']} ({productive} productive steps)"
    )
    base, step = h.get("device_base"), h.get("device_base_step")
    if base is None or step is None:
        return head + "; no base yet (read after the first productive step)"
    return (
        f"{head}; {base} before and at productive step {step}, "
        f"{h['device_fired'] - base} on the {productive - step} productive steps since"
    )
