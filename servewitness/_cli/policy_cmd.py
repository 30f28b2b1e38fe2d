"""``verifier policy init`` (a policy pinning a known-good boot), ``verifier policy check`` and
``verifier policy schema`` (the policy file's JSON Schema)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from servewitness._cli._local import load_tree, pick, side_label
from servewitness._cli.fmt import add_json, result
from servewitness.errors import ConfigError, UsageError
from servewitness.evidence.content import wheel_content
from servewitness.evidence.procfs import ProcFS
from servewitness.model import DRIFT_PTH_UNCLAIMED, Origin, ProcessReport, Provenance
from servewitness.policy import PolicyError, load_policy, policy_digest, weakest_point
from servewitness.policy import schema as policy_schema
from servewitness.policy.rules_claims import AllCodeClaimed
from servewitness.policy.rules_provenance import canonical
from servewitness.policy.strength import NO_LIVENESS, SERVING_DISTRIBUTIONS, UNPINNED_SERVING
from servewitness.policy.unsafe import shown, unsafe_flags

DESCRIPTION = """\
init: write a policy that pins what a known-good boot ran, for you to review and register
(`verifier run register`). From a live process tree (--from-pid) or a stored
`verifier inspect --json` file (--from), the process that runs the model (or --role) gives:
the live runner class; every hook seen firing on steps, with the fire rate it showed and the
target it wraps (one that fired only outside steps, at start-up or warm-up, is listed in a
comment); the runner's step file with its sha256; every distribution that claims a loaded
file and whose files were all pristine or patched, required pristine, with each patched file
declared with its hash, and each pinned ([[distributions]]) to the version and content digest
its RECORD gives (what pin-wheel computes from the published wheel: compare); every editable
(local) file and every file no distribution claims (unknown origin: a module on PYTHONPATH)
pinned by path and hash. Each hook line gives its
fired counts beside the step counts. With --claim-all-code, every process of the boot also
gives [provenance] all_code_claimed, only_distributions (every distribution they loaded) and
a claim of each code file no RECORD vouches for (-c code, editable and unknown files, by path
and sha256; a patched file of any distribution as a [[patches]] entry). Every process of the
boot gives a [[claims]] entry for each file whose bytes account for drift it showed: a .pth
that executes code, the file defining code set on a loader instance (virtualenv's
_virtualenv.py). The policy is checked by loading it before it is written.

check: load a policy and print its digest, its rules, its unsafe keys and its weakest point in
one line (what a PASS under it rests on at its thinnest); or the error (exit code 3). A policy
that could PASS on nothing is refused with a reason per weakening and the unsafe key that
would accept it: no liveness rule ([evidence] unsafe_allow_no_liveness), only hooks that need
no fire on a productive step ([evidence] unsafe_allow_zero_fires), vLLM's distribution not in
[provenance] pristine ([provenance] unsafe_allow_unpinned_serving_package). init fails the
same way, rather than writing such a policy, when the boot it pins shows no runner and no
hook firing on steps, or vLLM's files were not all pristine or patched; --allow-unsafe writes
the unsafe keys instead, each with a comment saying what it accepts, for you to review.

pin-wheel: print a [[distributions]] pin for each wheel file: its name, version and content
digest (one sha256 over its RECORD's rows of what it ships, as an install of it gives), and
the wheel file's own sha256 (compare it with the index's) in a comment.

schema: print the JSON Schema of policy files (draft-07; shipped in the package as
servewitness/policy/policy.schema.json), for editors and check-jsonschema, which reads TOML:
`verifier policy schema > policy.schema.json && check-jsonschema --schemafile
policy.schema.json policy.toml`. It checks keys, types, patterns and bounds; `check` also
checks what needs several values at once (a policy that could PASS on nothing, say)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "policy",
        help="write a policy from a known-good boot (init), check one (check), print its schema",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    psub = p.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    init = psub.add_parser("init", help="write a policy pinning a known-good boot")
    src = init.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-pid", type=int, metavar="PID", help="a live vLLM process (tree)")
    src.add_argument("--from", dest="from_file", metavar="FILE", help="`inspect --json` output")
    init.add_argument(
        "--role",
        choices=("api_server", "engine_core", "worker"),
        help="pin this role's process (default: the one that runs the model)",
    )
    init.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    init.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    init.add_argument(
        "--allow-unsafe",
        action="store_true",
        help="when the boot shows no liveness or vLLM not pristine, write the unsafe keys that "
        "accept it (each with a comment saying what it accepts) instead of failing",
    )
    init.add_argument(
        "--claim-all-code",
        action="store_true",
        help="also require every code file the boot's processes ran to be claimed "
        "([provenance] all_code_claimed, only_distributions), and claim by its sha256 each "
        "file no RECORD vouches for (-c code, editable and unknown files), for you to review",
    )
    init.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    init.set_defaults(handler=run_init, product_on_stdout=True)  # the policy, without -o
    check = psub.add_parser(
        "check", help="load a policy; print its digest and weakest point, or the error"
    )
    check.add_argument("file", metavar="FILE", help="the policy file (TOML)")
    add_json(check, '{"file", "digest", "rules", "unsafe", "weakest_point"}')
    check.set_defaults(handler=run_check)
    schema = psub.add_parser("schema", help="print the JSON Schema of policy files")
    schema.set_defaults(handler=run_schema)
    pin = psub.add_parser(
        "pin-wheel",
        help="print a [[distributions]] pin (version, content digest) for each wheel file",
    )
    pin.add_argument("wheels", nargs="+", metavar="WHEEL", help="a wheel file (.whl)")
    add_json(pin, '{"pins": [{"wheel", "name", "version", "content_sha256", "wheel_sha256"}]}')
    pin.set_defaults(handler=run_pin_wheel)


def _q(s: str) -> str:
    return json.dumps(s)  # a TOML basic string is a JSON string for these characters


def _floor_rate(rate: float) -> float:
    """RATE rounded down to two decimals, or to its first significant digit below 0.01, so a
    hook seen firing on productive steps is never pinned at 0 (which needs no fire)."""
    if rate >= 1:
        return 1.0
    digits = 2
    while digits < 12 and math.floor(rate * 10**digits) == 0:
        digits += 1
    return float(math.floor(rate * 10**digits) / 10**digits)


def _unsafe_tables(unsafe: list[tuple[str, str]]) -> list[str]:
    """``[evidence]`` / ``[provenance]`` lines setting each (flag, why) of UNSAFE."""
    out: list[str] = []
    for section in ("evidence", "provenance"):
        mine = [(f, why) for f, why in unsafe if f.startswith(section + ".")]
        if mine:
            out.append(f"[{section}]")
            for flag, why in mine:
                out += [f"# UNSAFE: {why}", f"{flag.partition('.')[2]} = true"]
            out.append("")
    return out


def _target_line(target: str) -> list[str]:
    """The ``target`` line pinning the code a hook was seen on; a comment when it has none
    (fired by name) or one a policy cannot name (a local function's ``<locals>``)."""
    from servewitness.policy.loader import HOOK_TARGET

    if HOOK_TARGET.match(target):
        return [f"target = {_q(target)}"]
    return [f"# target not pinned: {target or 'none, fired by name'}"]


def _hook_lines(r: ProcessReport) -> tuple[list[str], int]:
    """A ``[[hooks]]`` entry per hook R saw firing on productive steps, at the rate it showed
    (rounded down, never to 0); the others as comments. Also how many were pinned."""
    out: list[str] = []
    productive = r.steps.productive if r.steps else 0
    total = r.steps.total if r.steps else 0
    pinned_hooks = 0
    for h in r.hooks:
        counts = (
            f"{h.fired_productive} on {productive} productive steps, {h.fired_outside} "
            f"outside steps ({total} steps in all)"
        )
        if h.fired_productive <= 0:
            out += [
                f"# hook {h.name} fired {h.fired} times, none on a step: {counts}; not pinned",
                "",
            ]
            continue
        rate = h.fired_productive / productive if productive else 0.0
        minimum = _floor_rate(rate)
        pinned_hooks += 1
        out += [
            f"# hook {h.name} fired {h.fired} times, {counts}",
            "[[hooks]]",
            f"name = {_q(h.name)}",
            *_target_line(h.target),
            f"min_fires_per_productive_step = {minimum}",
            "",
        ]
    return out, pinned_hooks


def render_policy(
    label: str,
    r: ProcessReport,
    *,
    allow_unsafe: bool = False,
    claim_all: Sequence[ProcessReport] | None = None,
    tree: Sequence[ProcessReport] = (),
) -> str:
    """The TOML text pinning R's boot. With ALLOW_UNSAFE, the unsafe keys its weakenings need
    (no runner and no hook firing on steps; vLLM's distribution not pristine) are written
    with a comment each; without, such a policy does not load (``strength.py``). With
    CLAIM_ALL (every process of the boot), ``all_code_claimed`` and ``only_distributions``
    too, and a claim of every code file of theirs that the rule would leave unclaimed. TREE
    (every process of the boot; R alone when empty): a claim of each file whose bytes would
    account for a drift of theirs (``DriftFree``: a ``.pth`` that executes code, the code of
    a loader set on a loader instance, as virtualenv's ``_virtualenv.py`` sets one)."""
    prov = r.provenance
    out = [
        f"# Written by `verifier policy init` from {label}",
        f"# at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}. Review before registering.",
    ]
    if prov is not None:
        counts = ", ".join(f"{o} {n}" for o, n in prov.counts)
        out.append(f"# Loaded files by origin: {counts}.")
    out += ["version = 1", ""]
    if r.runner is not None:
        out += ["[runner]", f"expect_class = {_q(r.runner.cls)}", ""]
    hook_lines, pinned_hooks = _hook_lines(r)
    out += hook_lines
    if r.runner is not None and r.runner.file and r.runner.sha256:
        out += [
            "# the file defining the live runner's step method",
            "[[files]]",
            f"path = {_q(r.runner.file)}",
            f"sha256 = {_q(r.runner.sha256)}",
            "",
        ]
    unsafe: list[tuple[str, str]] = []
    if allow_unsafe and r.runner is None and not pinned_hooks:
        why = "the boot showed no live runner and no hook firing on steps"
        unsafe.append((NO_LIVENESS, why + ": a process that never ran a step can PASS"))
    if prov is None:
        out.append("# no provenance judgement: no [provenance] section written")
        if allow_unsafe:
            unsafe.append((UNPINNED_SERVING, "no provenance judgement: vLLM not pinned"))
        return "\n".join(out + _unsafe_tables(unsafe)) + "\n"
    unpinnable = {
        f.distribution
        for f in prov.files
        if f.distribution and f.origin not in (Origin.PATCHED, Origin.PRISTINE)
    }
    pristine = sorted(n for n, _, _ in prov.distributions if n not in unpinnable)
    if allow_unsafe and set(pristine).isdisjoint(SERVING_DISTRIBUTIONS):
        why = "vLLM's distribution was not loaded, or not all pristine or patched"
        unsafe.append((UNPINNED_SERVING, why + ": its files are not pinned"))
    out += _unsafe_tables([u for u in unsafe if u[0] != UNPINNED_SERVING])
    seen: set[tuple[str, str]] = set()
    claims = _claims(claim_all, pristine, seen) if claim_all is not None else ([], [])
    claims[1].extend(_drift_claims(tree or (r,), seen))
    if pristine or claim_all is not None or any(u[0] == UNPINNED_SERVING for u in unsafe):
        out.append("[provenance]")
        if pristine:
            out.append(f"pristine = [{', '.join(_q(n) for n in pristine)}]")
        out += claims[0]
        out += _unsafe_tables([u for u in unsafe if u[0] == UNPINNED_SERVING])[1:-1]
        out.append("")
    out += claims[1]
    out += _pins(prov, pristine)
    for f in prov.files:
        if f.origin == Origin.PATCHED and f.distribution in pristine and f.sha256:
            out += [
                f"# {f.path}: RECORD says {f.expected_sha256}",
                "[[patches]]",
                f"distribution = {_q(f.distribution)}",
                f"path = {_q(f.record_path or f.path)}",
                f"sha256 = {_q(f.sha256)}",
                "",
            ]
    out += _pinned_files(prov, r.runner.file if r.runner is not None else None)
    return "\n".join(out) + "\n"


def _pins(prov: Provenance, pristine: list[str]) -> list[str]:
    """A ``[[distributions]]`` pin (version and content digest, as the boot's RECORDs say) of
    each PRISTINE distribution installed once under its name; one installed twice is left to
    a comment (a pin takes one version and content)."""
    installs: dict[str, list[tuple[str, str]]] = {}
    for name, version, content in prov.contents:
        installs.setdefault(name, []).append((version, content))
    out: list[str] = []
    for name in pristine:
        got = installs.get(name, [])
        if len(got) != 1:
            out.append(f"# {name}: {len(got)} installs reported: not pinned")
            continue
        version, content = got[0]
        out += ["[[distributions]]", f"name = {_q(name)}", f"version = {_q(version)}"]
        out += [f"content_sha256 = {_q(content)}", ""]
    if out:
        out.insert(0, "# what each pristine distribution's RECORD says was installed: compare")
        out.insert(1, "# with the published wheels (verifier policy pin-wheel WHEEL)")
    return out


def run_pin_wheel(args: argparse.Namespace) -> int:
    """``policy pin-wheel``: each wheel's pin, computed as an install of it would give."""
    pins: list[dict[str, str]] = []
    lines: list[str] = []
    for w in args.wheels:
        try:
            c = wheel_content(Path(w))
        except ValueError as e:
            raise ConfigError(str(e)) from e
        name = canonical(c.name)
        pins.append(
            {"wheel": w, "name": name, "version": c.version, "content_sha256": c.sha256}
            | {"wheel_sha256": c.wheel_sha256}
        )
        lines += [f"# {Path(w).name}: the wheel's sha256 is {c.wheel_sha256}", "[[distributions]]"]
        lines += [f"name = {_q(name)}", f"version = {_q(c.version)}"]
        lines += [f"content_sha256 = {_q(c.sha256)}", ""]
    result(args, {"pins": pins}, lines)
    return 0


def _drift_claims(reports: Sequence[ProcessReport], seen: set[tuple[str, str]]) -> list[str]:
    """A ``[[claims]]`` table for each file of REPORTS' drift whose bytes would account for
    it (not already in SEEN, which gets them): the ``.pth`` of ``provenance.pth.unclaimed``,
    the files of ``provenance.module.unfiled``'s ``defined_in``."""
    tables: list[str] = []
    for r in reports:
        if not r.probe_present or r.provenance is None:
            continue
        files = {f.path: f for f in r.provenance.files}
        for d in r.drift:
            paths = (d.path,) if d.id == DRIFT_PTH_UNCLAIMED else d.defined_in
            for path in paths:
                f = files.get(path)
                if f is None or not f.sha256 or (path, f.sha256) in seen:
                    continue
                seen.add((path, f.sha256))
                what = (
                    "executes code at interpreter start"
                    if d.id == DRIFT_PTH_UNCLAIMED
                    else (f"defines the code a loader set on an instance ran for module {d.module}")
                )
                note = f"{r.role} pid {r.key.pid}: {what} ({d.id})"
                tables += ["[[claims]]", f"path = {_q(path)}", f"sha256 = {_q(f.sha256)}"]
                tables += [f"note = {_q(note)}", ""]
    if tables:
        tables.insert(0, "# files whose bytes account for drift the boot showed: review each one")
    return tables


def _claims(
    reports: Sequence[ProcessReport], pristine: list[str], seen: set[tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """``[provenance]`` lines (``all_code_claimed``, ``only_distributions``: every
    distribution a judged process of REPORTS loaded) and the tables that claim what the rule
    would leave unclaimed in them: a ``[[patches]]`` entry for a patched file of a
    distribution, a ``[[claims]]`` entry (path and sha256) for any other file and for ``-c``
    code; a file not hashed when loaded cannot be claimed and is listed in a comment. SEEN
    gets each (path, sha256) claimed."""
    judged = [r for r in reports if r.probe_present and r.provenance is not None]
    names = sorted({d for r in judged for d, _, _ in r.provenance.distributions} | {*pristine})  # type: ignore[union-attr]
    head = ["all_code_claimed = true"]
    if names:
        head.append(f"only_distributions = [{', '.join(_q(n) for n in names)}]")
    tables: list[str] = []
    for e in AllCodeClaimed(tuple(pristine)).unclaimed(judged):
        path, sha, dist, rel = e["path"], e["sha256"], e.get("distribution"), e.get("record_path")
        where = f"{e['role']} pid {e['pid']}"
        if path is None or not sha:
            tables.append(f"# {where}: {path or 'files'}: {e['why']}: cannot be claimed")
            continue
        if (path, sha) in seen:
            continue
        seen.add((path, sha))
        if e["origin"] == Origin.PATCHED and dist and rel:
            tables += ["[[patches]]", f"distribution = {_q(dist)}", f"path = {_q(rel)}"]
        else:
            tables += ["[[claims]]", f"path = {_q(path)}"]
        note = f"{where}: {e['why']}"
        tables += [f"sha256 = {_q(sha)}", f"note = {_q(note)}", ""]
    if tables:
        tables.insert(0, "# code no RECORD vouches for, claimed by its bytes: review each one")
    return head, tables


def _pinned_files(prov: Provenance, runner_file: str | None) -> list[str]:
    """``[[files]]`` pins, by full path and sha256, of every editable file and every file no
    distribution claims (``unknown``: a module on PYTHONPATH, a script); bytecode is left to
    its source, and the runner's step file is pinned above. Files that cannot be pinned (not
    hashed when loaded) and generated files (compile caches, rewritten between boots) are
    listed in comments for the reviewer."""
    out: list[str] = []
    unhashed: list[str] = []
    for want, title in (
        (Origin.EDITABLE, "editable (local) files"),
        (Origin.UNKNOWN, "files no distribution claims (unknown origin)"),
    ):
        pins = []
        for f in prov.files:
            if f.origin != want or f.path.endswith(".pyc") or f.path in (runner_file, "-c"):
                continue
            if f.reason.startswith("mapped native code"):  # no module file: [[files]] cannot pin
                continue
            if not f.sha256:
                unhashed.append(f.path)
                continue
            pins += ["[[files]]", f"path = {_q(f.path)}", f"sha256 = {_q(f.sha256)}", ""]
        if pins:
            out += [f"# {title}, pinned by path and sha256", *pins]
    generated = sum(f.origin == Origin.GENERATED for f in prov.files)
    for path in unhashed:
        out.append(f"# {path}: not hashed when loaded, so not pinned")
    if generated:
        out.append(f"# {generated} generated files (compile caches) not pinned")
    return out


def run_init(args: argparse.Namespace) -> int:
    if args.from_pid is not None and args.from_pid <= 0:
        raise UsageError(f"--from-pid must be a positive integer, got {args.from_pid}")
    spec = str(args.from_pid) if args.from_pid is not None else args.from_file
    where, reports = load_tree(spec, ProcFS(args.proc))
    report = pick(reports, args.role, where)
    label = side_label(where, report)
    claim_all = reports if args.claim_all_code else None
    text = render_policy(
        label, report, allow_unsafe=args.allow_unsafe, claim_all=claim_all, tree=reports
    )
    try:
        policy = load_policy(text, "<generated policy>")  # never write one that does not load
    except PolicyError as e:
        hint = "" if args.allow_unsafe else " (--allow-unsafe writes the keys, for review)"
        raise ConfigError(f"{e.explain()}{hint}") from e
    if args.output is None:
        sys.stdout.write(text)
        return 0
    target = Path(args.output)
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    try:
        target.write_text(text)
    except OSError as e:
        raise ConfigError(f"cannot write {target}: {e}") from e
    print(f"wrote {target} ({len(policy.rules)} rules, {policy_digest(text)})", file=sys.stderr)
    return 0


def run_check(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    policy = load_policy(text, str(path))
    rules = [rule.describe() for rule in policy.rules]
    flags = [shown(flag) for flag in unsafe_flags(policy)]
    weakest = weakest_point(policy)
    doc = {
        "file": str(path), "digest": policy_digest(text), "rules": rules, "unsafe": flags,
        "weakest_point": weakest,
    }  # fmt: skip
    lines = [f"{path}: ok, {policy_digest(text)}", *(f"  {r}" for r in rules)]
    result(args, doc, [*lines, *(f"  UNSAFE {f}" for f in flags), weakest])
    return 0


def run_schema(args: argparse.Namespace) -> int:
    shipped = resources.files(policy_schema.__package__ or "") / policy_schema.SCHEMA_FILE
    sys.stdout.write(shipped.read_text())
    return 0
