"""A run's verdict as text, at three levels of detail (``verifier status`` and ``wait``).

- ``BRIEF`` (``wait``'s default): the verdict, each target, each hook's count, every finding
  that is not INFO (what changes or explains the verdict), and how many INFO findings there
  are;
- ``NORMAL`` (``status``'s default): every finding, with file lists folded: this tool's own
  files in one "self" line (:mod:`servewitness._cli.selffiles`), a list that repeats an earlier
  process's list as a count;
- ``FULL`` (``-v``): every file of every list.

Nothing that changes the verdict is folded: findings other than ``provenance.origins`` are
never shortened, and a file of this tool's that is not as installed is listed on its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servewitness._cli import selffiles
from servewitness._cli.fmt import text
from servewitness.model import Finding, HookCount, RunVerdict, Severity

BRIEF, NORMAL, FULL = 0, 1, 2


def detail(verbose: int, default: int) -> int:
    """The level for -v given VERBOSE times on a command whose default is DEFAULT."""
    return FULL if verbose else default


def reason(v: RunVerdict) -> str:
    """Why the run is where it is, in one line: its first ERROR, else PENDING, else WARNING
    finding (run-level first), else the verdict itself."""
    findings = [*v.findings, *(f for t in v.targets for f in t.findings)]
    for severity in (Severity.ERROR, Severity.PENDING, Severity.WARNING):
        for f in findings:
            if f.severity == severity:
                where = f"{text(f.target)}: " if f.target else ""
                return f"{where}{text(f.message, 120)}"
    return f"{len(v.targets)} target(s) {v.verdict.value}"


def render(v: RunVerdict, level: int = NORMAL) -> str:
    unsafe = [text(f.context.get("flag")) for f in v.findings if f.id == "policy.unsafe"]
    named = f"  UNSAFE: {'; '.join(unsafe)}" if unsafe else ""  # never only in the findings
    digest = text(v.policy_digest, 0)[:19]  # sha256: and 12 hex: enough to tell policies apart
    lines = [f"run {text(v.run)}: {v.verdict.value}  (policy {digest}){named}"]
    hidden = 0
    for f in v.findings:
        if level == BRIEF and f.severity == Severity.INFO:
            hidden += 1
            continue
        lines.append(_finding(f, "  "))
    for t in v.targets:
        lines.append(f"  target {text(t.target)}: {t.verdict.value}")
        lines.extend(_hook(h, level) for h in t.hooks)
        seen: dict[tuple[str, ...], str] = {}
        findings = list(t.findings)
        if level == BRIEF:
            hidden += sum(f.severity == Severity.INFO for f in findings)
            findings = [f for f in findings if f.severity != Severity.INFO]
        shown = [(f, ()) for f in findings] if level == FULL else _grouped(findings)
        for f, where in shown:
            if where:
                lines.append(_finding(f, "    ", where))
                continue
            lines.append(_finding(f, "    "))
            if f.id == "provenance.origins":
                lines.extend(_files(f, level, seen))
    if hidden:
        lines.append(f"  ({hidden} info findings: -v or --json shows them)")
    return "\n".join(lines) + "\n"


def _finding(f: Finding, indent: str, where: Sequence[str] = ()) -> str:
    if not where:
        return f"{indent}{f.severity.value:<7} {text(f.id)}: {text(f.message, 0)}"
    rest = f.message[len(_process(f)) + 2 :]
    return (
        f"{indent}{f.severity.value:<7} {text(f.id)}: in {len(where)} processes "
        f"({', '.join(where)}): {text(rest, 0)}"
    )


def _process(f: Finding) -> str:
    """How a finding's message names its process (policy/_evidence.name), "" if it has none."""
    c = f.context
    if not isinstance(c.get("pid"), int) or not isinstance(c.get("role"), str):
        return ""
    rank = "" if c.get("rank") is None else f" rank {c.get('rank')}"
    return f"{c['role']}{rank} (pid {c['pid']})"


def _grouped(findings: list[Finding]) -> list[tuple[Finding, tuple[str, ...]]]:
    """FINDINGS with each WARNING or INFO finding that says the same thing about several
    processes (same id and severity, same message after the process's name) given once, with
    the processes (the second item; empty for a finding shown as it is). ERROR and PENDING
    findings, and provenance.origins (its files differ), are never grouped."""
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    order: list[Finding | tuple[str, str, str]] = []  # a finding shown as it is, or a group
    for f in findings:
        who = _process(f)
        groupable = (
            f.severity in (Severity.WARNING, Severity.INFO)
            and f.id != "provenance.origins"
            and who
            and f.message.startswith(who + ": ")
        )
        if not groupable:
            order.append(f)
            continue
        key = (f.id, f.severity.value, f.message[len(who) + 2 :])
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(f)
    result: list[tuple[Finding, tuple[str, ...]]] = []
    for item in order:
        if isinstance(item, Finding):
            result.append((item, ()))
            continue
        members = groups[item]
        where = tuple(text(_process(g)) for g in members) if len(members) > 1 else ()
        result.append((members[0], where))
    return result


def _hook(h: HookCount, level: int) -> str:
    rank = f" rank {h.rank}" if h.rank is not None else ""
    head = f"    hook {text(h.name)} ({text(h.role)}{rank}, pid {h.pid}): fired "
    if level == BRIEF:
        judged = {"decode": (h.fired_decode, h.decode_steps),
                  "prefill": (h.fired_prefill, h.prefill_steps)}.get(
            h.on, (h.fired_productive, h.productive_steps))  # fmt: skip
        return f"{head}{judged[0]} on {judged[1]} {h.on} steps"
    return (
        f"{head}{h.fired_productive} on {h.productive_steps} productive steps, {h.fired_decode} "
        f"on {h.decode_steps} decode steps, {h.fired_outside} outside steps ({h.fired} in all, "
        f"{h.total_steps} steps; judged on {h.on})"
    )


def _file(x: Mapping[str, Any]) -> str:
    dist = f" [{text(x.get('distribution'))}]" if x.get("distribution") else ""
    return (
        f"      {text(x.get('origin', '?')):<9} {text(x.get('path'), 0)}{dist}: "
        f"{text(x.get('reason'), 0)}"
    )


def _files(f: Finding, level: int, seen: dict[tuple[str, ...], str]) -> list[str]:
    """A provenance.origins finding's file lines at LEVEL; SEEN: the lists (as their lines)
    already shown for this target, and which process showed them."""
    files: Sequence[Mapping[str, Any]] = f.context.get("files") or ()
    if level == FULL:
        return [_file(x) for x in files]
    parts = selffiles.split(files)
    out: list[str] = []
    if parts.own:
        dists = sorted({text(x.get("distribution")) for x in parts.own})
        origins = sorted({text(x.get("origin")) for x in parts.own})
        unhashed = f", {parts.unhashed()} without a hash" if parts.unhashed() else ""
        out.append(
            f"      self      {len(parts.own)} files of this tool ({', '.join(dists)}; "
            f"{'/'.join(origins)}), digest {parts.digest()}{unhashed} (-v lists them)"
        )
    rest = tuple(_file(x) for x in parts.rest)
    if not rest:
        return out
    who = f"pid {f.context.get('pid', '?')}"
    if rest in seen:
        out.append(f"      the same {len(rest)} other files as {seen[rest]} (-v lists them)")
    else:
        seen[rest] = who
        out.extend(rest)
    return out
