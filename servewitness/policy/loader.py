"""Load a TOML policy, checking every key, type and value, with errors that name the line.

Policies fail closed: unknown keys, wrong types, empty arrays, impossible values and a policy
without rules are all errors (``PolicyError``, exit code 3), never silently ignored; so is a
policy that could PASS on nothing (no liveness, hooks that need no fire, vLLM not required
pristine) unless it names the ``unsafe_*`` key that accepts that weakening (``strength.py``).

Size: one module because every section's parser reads through the same ``_Doc``/``_Table``
checks, whose errors name the key and its line; the rules themselves live in ``rules*.py``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from typing import Any

from servewitness.policy import findings as F
from servewitness.policy import interface as I
from servewitness.policy._locate import Path, key_lines, line_of
from servewitness.policy.engine import Policy
from servewitness.policy.rules import (
    EvidenceIntact,
    ExpectRunner,
    FileSpec,
    ForbidFile,
    HookFires,
    NativeIntact,
    ProbeRequired,
    RequireFile,
    RunnerWitnessed,
    ViewsAgree,
)
from servewitness.policy.rules_claims import AllCodeClaimed, OnlyDistributions
from servewitness.policy.rules_container import spec_error
from servewitness.policy.rules_pins import DistributionsPinned, Pin
from servewitness.policy.rules_provenance import (
    DriftFree,
    HashedAfterReported,
    OriginsReported,
    Pristine,
    canonical,
)
from servewitness.policy.strength import refusal, weakenings
from servewitness.policy.unsafe import unsafe_flags
from servewitness.policy.vouch import Claim, Patch

VERSION = 1
# The keys of each table, by its path (``[[hooks]]`` entries: "hooks"); the JSON Schema of
# policies (``schema.py``) is generated from these and the patterns below.
KEYS: dict[str, tuple[str, ...]] = {
    "": (
        "version",
        "targets",
        "evidence",
        "runner",
        "hooks",
        "files",
        "forbid",
        "provenance",
        "patches",
        "claims",
        "distributions",
    ),
    "targets": ("names", "replicas_of", "container_ids", "min_targets", "containers"),
    "evidence": (
        "freshness_s",
        "clock_skew_s",
        "min_steps",
        "require_probe",
        "unsafe_allow_unauthenticated",
        "unsafe_allow_no_liveness",
        "unsafe_allow_zero_fires",
    ),
    "runner": ("expect_class", "witness"),
    "hooks": ("name", "target", "role", "min_fires_per_productive_step", "on", "count"),
    "files": ("path", "module", "role", "sha256"),
    "forbid": ("path", "module", "role"),
    "provenance": (
        "pristine",
        "allow",
        "unsafe_allow_unpinned_serving_package",
        "all_code_claimed",
        "only_distributions",
    ),
    "patches": ("distribution", "path", "sha256", "note"),
    "claims": ("path", "sha256", "note"),
    "distributions": ("name", "version", "content_sha256", "note"),
}
_TOP = KEYS[""]
_DISTRIBUTION = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
_TOML_AT = re.compile(r"\s*\(at line (\d+), column \d+\)$|\s*\(at end of document\)$")
_QUALNAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# A hook's target as the probe records it: module, or module:qualname.
HOOK_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*)?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CONTAINER = re.compile(r"^[0-9a-f]{12,64}$")
_FAMILY = re.compile(r"^[^/\s][^/]*$")  # a replicas_of family: a target name, no "/"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def format_key(path: Path) -> str:
    """``hooks[2].nmae``: keys dotted (quoted when not bare), entries counted from 1."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part + 1}]"
        else:
            name = part if _BARE_KEY.match(part) else json.dumps(part)
            out += f".{name}" if out else name
    return out


_KINDS = (
    (bool, "a boolean"),  # before int: a bool is an int to isinstance
    (int, "an integer"),
    (float, "a float"),
    (str, "a string"),
    (list, "an array"),
    (dict, "a table"),
)


def _kind(value: object) -> str:
    for t, kind in _KINDS:
        if isinstance(value, t):
            return kind
    return f"a {type(value).__name__}"  # dates and times


class _Doc:
    """The source text's name and key lines: turns a path and a complaint into a PolicyError."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines = key_lines(text)

    def error(self, path: Path, what: str) -> I.PolicyError:
        return I.PolicyError(self.source, line_of(self.lines, path), format_key(path), what)


class _Table:
    """One TOML table of the policy; rejects unknown keys as soon as it is read."""

    def __init__(self, doc: _Doc, data: dict[str, Any], path: Path, allowed: tuple[str, ...]):
        self.doc, self.data, self.path = doc, data, path
        unknown = [k for k in data if k not in allowed]
        if unknown:
            first = min(unknown, key=lambda k: doc.lines.get((*path, k), 0))
            close = difflib.get_close_matches(first, allowed, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise doc.error((*path, first), f"unknown key ({hint}allowed: {', '.join(allowed)})")

    def error(self, key: str | int, what: str) -> I.PolicyError:
        return self.doc.error((*self.path, key), what)

    def _get(self, key: str, want: tuple[type, ...], kind: str, required: bool) -> Any:
        if key not in self.data:
            if required:
                raise self.doc.error(self.path, f"required key {key} is missing")
            return None
        value = self.data[key]
        if (isinstance(value, bool) and bool not in want) or not isinstance(value, want):
            raise self.error(key, f"must be {kind}, not {_kind(value)}")
        return value

    def string(
        self,
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        form: str = "",
    ) -> str | None:
        value: str | None = self._get(key, (str,), "a string", required)
        if value is None:
            return None
        if not value.strip():
            raise self.error(key, "must not be empty")
        if pattern is not None and not pattern.match(value):
            raise self.error(key, f"{value!r} is not {form}")
        return value

    def number(self, key: str, default: float, *, minimum: float, above: bool = False) -> float:
        value: float | None = self._get(key, (int, float), "a number", False)
        if value is None:
            return default
        if not math.isfinite(value):
            raise self.error(key, f"must be a finite number, not {value}")
        if value < minimum or (above and value == minimum):
            bound = "greater than" if above else "at least"
            raise self.error(key, f"must be {bound} {minimum:g}, not {value:g}")
        return float(value)

    def boolean(self, key: str, *, default: bool) -> bool:
        value: bool | None = self._get(key, (bool,), "a boolean", False)
        return default if value is None else value

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        value: int | None = self._get(key, (int,), "an integer", False)
        if value is None:
            return default
        if value < minimum:
            raise self.error(key, f"must be at least {minimum}, not {value}")
        return value

    def strings(
        self,
        key: str,
        *,
        pattern: re.Pattern[str] | None = None,
        form: str = "",
        choices: tuple[str, ...] = (),
    ) -> tuple[str, ...] | None:
        """A non-empty array of distinct non-empty strings (None when the key is absent)."""
        values: list[Any] | None = self._get(key, (list,), "an array of strings", False)
        if values is None:
            return None
        if not values:
            raise self.error(key, "must not be empty (leave the key out to get the default)")
        path = (*self.path, key)
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise self.doc.error((*path, i), f"must be a string, not {_kind(v)}")
            if not v.strip():
                raise self.doc.error((*path, i), "must not be empty")
            if choices and v not in choices:
                raise self.doc.error((*path, i), f"{v!r} is not one of {', '.join(choices)}")
            if pattern is not None and not pattern.match(v):
                raise self.doc.error((*path, i), f"{v!r} is not {form}")
            if v in values[:i]:
                raise self.doc.error((*path, i), f"{v!r} is listed twice")
        return tuple(values)

    def role(self, key: str, choices: tuple[str, ...] = I.ROLES, why: str = "") -> str | None:
        value = self.string(key)
        if value is not None and value not in choices:
            raise self.error(key, f"{value!r} is not one of {', '.join(choices)}{why}")
        return value


def _section(doc: _Doc, data: dict[str, Any], key: str, allowed: tuple[str, ...]) -> _Table | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, dict):
        raise doc.error((key,), f"must be a table ([{key}]), not {_kind(value)}")
    return _Table(doc, value, (key,), allowed)


def _entries(doc: _Doc, data: dict[str, Any], key: str, allowed: tuple[str, ...]) -> list[_Table]:
    if key not in data:
        return []
    value = data[key]
    if not isinstance(value, list):
        raise doc.error((key,), f"must be an array of tables ([[{key}]]), not {_kind(value)}")
    if not value:
        raise doc.error((key,), "must not be empty (leave the key out instead)")
    out = []
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise doc.error((key, i), f"must be a table ([[{key}]]), not {_kind(entry)}")
        out.append(_Table(doc, entry, (key, i), allowed))
    return out


def _targets(doc: _Doc, data: dict[str, Any]) -> I.TargetSelection:
    t = _section(doc, data, "targets", KEYS["targets"])
    if t is None:
        return I.TargetSelection()
    names = t.strings("names") or ()
    ids = (
        t.strings(
            "container_ids",
            pattern=_CONTAINER,
            form="a container id prefix (12 to 64 lowercase hex digits)",
        )
        or ()
    )
    families = (
        t.strings(
            "replicas_of",
            pattern=_FAMILY,
            form="a target name without '/' (its instances are FAMILY/<pod or container>)",
        )
        or ()
    )
    min_targets = t.integer("min_targets", I.DEFAULT_MIN_TARGETS, minimum=1)
    if names and not families and min_targets > len(names):
        raise t.error("min_targets", f"is {min_targets} but names lists only {len(names)}")
    return I.TargetSelection(
        names=names,
        container_ids=ids,
        min_targets=min_targets,
        replicas_of=families,
        containers=_bindings(doc, t, names + families),
    )


def _bindings(doc: _Doc, t: _Table, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``[targets.containers]``: target name = the container its evidence must come from."""
    table: dict[str, Any] | None = t._get("containers", (dict,), "a table", False)
    if table is None:
        return ()
    if not table:
        raise t.error("containers", "must not be empty (leave the table out instead)")
    b = _Table(doc, table, ("targets", "containers"), tuple(table))
    out = []
    for target in table:
        spec = b.string(target, required=True) or ""
        why = spec_error(spec)
        if why:
            raise b.error(target, f"{spec!r} is {why}")
        if names and target not in names:
            raise b.error(
                target,
                f"binds target {target!r}, which [targets] names and replicas_of do not list",
            )
        out.append((target, spec))
    return tuple(out)


def _names(data: dict[str, Any], section: str, key: str) -> bool:
    """Whether the policy itself sets SECTION.KEY (not left to the default)."""
    table = data.get(section)
    return isinstance(table, dict) and key in table


def _evidence(doc: _Doc, data: dict[str, Any]) -> I.EvidenceSettings:
    e = _section(doc, data, "evidence", KEYS["evidence"])
    if e is None:
        return I.EvidenceSettings()
    return I.EvidenceSettings(
        freshness_s=e.number("freshness_s", I.DEFAULT_FRESHNESS_S, minimum=0, above=True),
        clock_skew_s=e.number("clock_skew_s", I.DEFAULT_CLOCK_SKEW_S, minimum=0, above=True),
        min_steps=e.integer("min_steps", I.DEFAULT_MIN_STEPS, minimum=1),
        require_probe=e.strings("require_probe", choices=I.ROLES) or I.DEFAULT_REQUIRE_PROBE,
        unsafe_allow_unauthenticated=e.boolean("unsafe_allow_unauthenticated", default=False),
        unsafe_allow_no_liveness=e.boolean("unsafe_allow_no_liveness", default=False),
        unsafe_allow_zero_fires=e.boolean("unsafe_allow_zero_fires", default=False),
    )


def _runner(doc: _Doc, data: dict[str, Any]) -> list[I.Rule]:
    r = _section(doc, data, "runner", KEYS["runner"])
    if r is None:
        return []
    cls = r.string(
        "expect_class",
        required=True,
        pattern=_QUALNAME,
        form="a qualified class name (package.module.Class)",
    )
    witness = r.boolean("witness", default=False)
    return [ExpectRunner(str(cls)), *([RunnerWitnessed()] if witness else [])]


def _hooks(doc: _Doc, data: dict[str, Any]) -> list[I.Rule]:
    out: list[I.Rule] = []
    seen: set[tuple[str, str | None, str, str]] = set()
    step_roles = ", only these run steps"
    for h in _entries(doc, data, "hooks", KEYS["hooks"]):
        name = str(h.string("name", required=True))
        target = h.string("target", pattern=HOOK_TARGET, form="module:qualname")
        role = h.role("role", I.STEP_ROLES, step_roles)
        ratio = h.number(
            "min_fires_per_productive_step", I.DEFAULT_MIN_FIRES_PER_PRODUCTIVE_STEP, minimum=0
        )
        on = h.string("on") or "productive"
        if on not in I.HOOK_PHASES:
            raise h.error("on", f"{on!r} is not one of {', '.join(I.HOOK_PHASES)}")
        count = h.string("count") or "python"
        if count not in I.HOOK_COUNTS:
            raise h.error("count", f"{count!r} is not one of {', '.join(I.HOOK_COUNTS)}")
        if count == "device" and on != "productive":
            raise h.error(
                "count",
                f'"device" counts every step the hooked code ran in; it cannot be judged '
                f'on {on} steps alone (use on = "productive")',
            )
        if (name, role, on, count) in seen:
            raise h.error("name", f"hook {name} is listed twice for the same role and steps")
        seen.add((name, role, on, count))
        out.append(HookFires(name, role, ratio, on, count, target))
    return out


def _spec(t: _Table) -> FileSpec:
    path = t.string("path")
    module = t.string("module", pattern=_MODULE, form="a dotted module name")
    if path is None and module is None:
        raise t.doc.error(t.path, "needs path or module")
    if path is not None and module is not None:
        raise t.error("module", "give path or module, not both (use two entries)")
    if path is not None and (path.endswith("/") or path.startswith("./") or "//" in path):
        raise t.error("path", f"{path!r} must name a file as a path suffix (a/b.py) or in full")
    return FileSpec(path=path, module=module)


def _files(doc: _Doc, data: dict[str, Any]) -> list[I.Rule]:
    out: list[I.Rule] = []
    for f in _entries(doc, data, "files", KEYS["files"]):
        spec = _spec(f)
        sha = f.string("sha256", pattern=_SHA256, form="64 lowercase hex digits")
        out.append(RequireFile(spec, f.role("role"), sha))
    return out


def _forbid(doc: _Doc, data: dict[str, Any]) -> list[I.Rule]:
    return [
        ForbidFile(_spec(f), f.role("role")) for f in _entries(doc, data, "forbid", KEYS["forbid"])
    ]


def _provenance(doc: _Doc, data: dict[str, Any]) -> tuple[list[I.Rule], I.ProvenanceSettings]:
    """``[provenance]``, ``[[patches]]`` and ``[[claims]]``: the Pristine rule (if any), the
    claims rules (if asked for), the allowed drift and the unsafe key."""
    p = _section(doc, data, "provenance", KEYS["provenance"])
    pristine: tuple[str, ...] = ()
    allow: tuple[str, ...] = ()
    unpinned = claimed = False
    only: tuple[str, ...] | None = None
    if p is not None:
        unpinned = p.boolean("unsafe_allow_unpinned_serving_package", default=False)
        claimed = p.boolean("all_code_claimed", default=False)
        pristine = _distributions(doc, p, "pristine") or ()
        only = _distributions(doc, p, "only_distributions")
        allow = p.strings("allow", choices=F.ALLOWABLE_DRIFT) or ()
    for i, name in enumerate(pristine if only is not None else ()):
        if name not in (only or ()):
            raise doc.error(
                ("provenance", "pristine", i),
                f"{name!r} is required pristine but not in provenance.only_distributions",
            )
    patches = []
    seen: set[tuple[str, str]] = set()
    for t in _entries(doc, data, "patches", KEYS["patches"]):
        dist = canonical(
            str(t.string("distribution", required=True, pattern=_DISTRIBUTION, form="a name"))
        )
        if dist not in pristine and not claimed:
            raise t.error(
                "distribution",
                f"{dist!r} is not in provenance.pristine (and provenance.all_code_claimed is "
                "not set), so a patch of it would allow nothing",
            )
        path = str(t.string("path", required=True))
        if path.startswith("/") or ".." in path.split("/"):
            raise t.error("path", f"{path!r} must be the path as the RECORD writes it (a/b.py)")
        sha = str(t.string("sha256", required=True, pattern=_SHA256, form="64 lowercase hex"))
        if (dist, path) in seen:
            raise t.error("path", f"{path!r} of {dist} is declared twice")
        seen.add((dist, path))
        patches.append(Patch(dist, path, sha, t.string("note") or ""))
    claims = _claims(doc, data)
    own = tuple(x for x in patches if x.distribution in pristine)  # the rest: claims only
    rules: list[I.Rule] = [Pristine(pristine, own)] if pristine else []
    if claimed:
        rules.append(AllCodeClaimed(pristine, tuple(patches), claims))
    if only is not None:
        rules.append(OnlyDistributions(only))
    pins = _pins(doc, data, pristine)
    if pins:
        rules.append(DistributionsPinned(pins))
    return rules, I.ProvenanceSettings(allow, unpinned, claims, tuple(patches))


def _distributions(doc: _Doc, p: _Table, key: str) -> tuple[str, ...] | None:
    """A list of distribution names, canonical (PEP 503), none twice; None when absent."""
    names = p.strings(key, pattern=_DISTRIBUTION, form="a distribution name")
    if names is None:
        return None
    canon = [canonical(n) for n in names]
    for i, c in enumerate(canon):
        if c in canon[:i]:
            raise doc.error(("provenance", key, i), f"{names[i]!r} is listed twice")
    return tuple(canon)


def _pins(doc: _Doc, data: dict[str, Any], pristine: tuple[str, ...]) -> tuple[Pin, ...]:
    """``[[distributions]]``: a version and, optionally, a content digest per distribution,
    each one required pristine (a pin of files that may differ from their RECORD would pin
    nothing), none twice."""
    out: dict[str, Pin] = {}
    for t in _entries(doc, data, "distributions", KEYS["distributions"]):
        raw = str(t.string("name", required=True, pattern=_DISTRIBUTION, form="a name"))
        name = canonical(raw)
        if name not in pristine:
            raise t.error("name", f"{raw!r} is pinned but not in provenance.pristine")
        if name in out:
            raise t.error("name", f"{raw!r} is pinned twice")
        version = str(t.string("version", required=True))
        if not version.strip() or version != version.strip():
            raise t.error("version", f"{version!r} must be a version as METADATA writes it")
        digest = t.string("content_sha256", pattern=_SHA256, form="64 lowercase hex")
        out[name] = Pin(name, version, digest, t.string("note") or "")
    return tuple(out.values())


def _claims(doc: _Doc, data: dict[str, Any]) -> tuple[Claim, ...]:
    """``[[claims]]``: each a path (absolute, a suffix at a '/' boundary, or "-c") and the
    sha256 of the bytes vouched for there: code files under ``provenance.all_code_claimed``,
    and always a ``.pth`` or a loader's code that drift names (``DriftFree``)."""
    out: list[Claim] = []
    seen: set[tuple[str, str]] = set()
    for t in _entries(doc, data, "claims", KEYS["claims"]):
        path = str(t.string("path", required=True))
        parts = path.split("/")
        if not path.strip("/") or ".." in parts or "" in parts[1:] or "." in parts:
            raise t.error("path", f"{path!r} must be an absolute path or a suffix like a/b.py")
        sha = str(t.string("sha256", required=True, pattern=_SHA256, form="64 lowercase hex"))
        if (path, sha) in seen:
            raise t.error("path", f"{path!r} is claimed twice with the same sha256")
        seen.add((path, sha))
        out.append(Claim(path, sha, t.string("note") or ""))
    return tuple(out)


def load_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and check a policy. Raises PolicyError naming the source, line and key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = _TOML_AT.search(msg)
        if m is None:
            line, what = None, msg
        else:
            line = int(m.group(1)) if m.group(1) else text.count("\n") + 1
            what = msg[: m.start()]
        raise I.PolicyError(source, line, None, f"invalid TOML: {what}") from e
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise I.PolicyError(source, None, None, "invalid TOML: nested too deep") from None
    doc = _Doc(text, source)
    _Table(doc, data, (), _TOP)
    version = data.get("version")
    if version is None:
        raise I.PolicyError(
            source, None, "version", f"required key is missing (write version = {VERSION})"
        )
    if isinstance(version, bool) or not isinstance(version, int):
        raise doc.error(("version",), f"must be an integer, not {_kind(version)}")
    if version != VERSION:
        raise doc.error(
            ("version",), f"unsupported version {version} (this verifier reads {VERSION})"
        )
    selection = _targets(doc, data)
    evidence = _evidence(doc, data)
    provenance, prov = _provenance(doc, data)
    rules = [
        *_runner(doc, data),
        *_hooks(doc, data),
        *_files(doc, data),
        *_forbid(doc, data),
        *provenance,
    ]
    if not rules:
        raise I.PolicyError(
            source,
            None,
            None,
            "the policy has no rules: give at least one of [runner], [[hooks]], [[files]], "
            "[[forbid]] or [provenance] pristine (an empty policy would pass anything, so it "
            "is invalid)",
        )
    policy = Policy(
        rules=(
            ProbeRequired(
                evidence.require_probe,
                explicit=_names(data, "evidence", "require_probe"),
                hooks=frozenset(r.name for r in rules if isinstance(r, HookFires)),
                files_judged=any(not isinstance(r, HookFires) for r in rules),
            ),
            ViewsAgree(),
            NativeIntact(),
            EvidenceIntact(),
            DriftFree(frozenset(prov.allow), prov.claims, prov.patches),
            *rules,
            HashedAfterReported(),
            OriginsReported(),  # last: the record of origins closes each target's findings
        ),
        evidence=evidence,
        selection=selection,
        source=source,
        provenance=prov,
    )
    accepted = unsafe_flags(policy)
    why = refusal(rules, accepted)
    if why is not None:
        flags = tuple(w.flag for w in weakenings(rules) if w.flag not in accepted)
        raise I.WeakPolicyError(source, why, flags)
    return policy
