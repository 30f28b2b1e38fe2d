"""The JSON Schema of policy files (draft-07, for editors and ``check-jsonschema``), generated
from the loader's own tables: its keys (``loader.KEYS``), patterns, roles, hook phases and
counts, drift ids and defaults. The package ships it as ``policy.schema.json``
(``verifier policy schema`` prints it); a test keeps the shipped file equal to ``build()``
and drives the loader to check that both accept the same keys and types.

The schema checks each key, type, pattern, enumeration and bound, exactly one of ``path`` and
``module``, ``count = "device"`` only with ``on = "productive"``, and that a policy has a
rule. What needs more than one value at a time stays the loader's alone: ``min_targets`` above
the names listed, a hook listed twice, a patch of a distribution not pristine, a policy that
could PASS on nothing without its ``unsafe_*`` key (``strength.py``), non-finite numbers, and
non-ASCII identifiers in class and module names (the schema's patterns are ASCII, as ECMA-262
reads ``\\w``). ``verifier policy check`` is the authority; the schema is a first line.
"""

from __future__ import annotations

import json
import re
from typing import Any

from servewitness.policy import interface as I
from servewitness.policy import loader as L
from servewitness.policy.findings import ALLOWABLE_DRIFT

SCHEMA_FILE = "policy.schema.json"
DRAFT = "http://json-schema.org/draft-07/schema#"
_NOT_BLANK = r"\S"  # the loader refuses empty and all-blank strings
_CONTAINER_SPEC = r"^(label:[^=]+=[\s\S]*|[a-zA-Z0-9][a-zA-Z0-9_.-]*)$"

Schema = dict[str, Any]


def _ecma(pattern: re.Pattern[str]) -> str:
    return pattern.pattern.replace(r"\w", "[A-Za-z0-9_]")


def _string(description: str, pattern: str = _NOT_BLANK) -> Schema:
    return {"type": "string", "pattern": pattern, "description": description}


def _strings(description: str, item: Schema) -> Schema:
    return {
        "type": "array",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"type": "string", "pattern": _NOT_BLANK, **item},
        "description": description,
    }


def _enum(choices: tuple[str, ...], description: str) -> Schema:
    return {"type": "string", "enum": list(choices), "description": description}


def _table(key: str, properties: Schema, description: str, **more: Any) -> Schema:
    if tuple(properties) != L.KEYS[key]:
        raise AssertionError(f"schema of [{key}] drifted from the loader's keys")
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "description": description,
        **more,
    }


def _entries(table: Schema, description: str) -> Schema:
    return {"type": "array", "minItems": 1, "items": table, "description": description}


_SHA256 = _string("expected sha256 of the file: 64 lowercase hex digits", _ecma(L._SHA256))
_ROLE = _enum(I.ROLES, "only processes of this role (default: see docs/policy.md)")
_PATH = {
    **_string("suffix of a loaded file's path at a '/' boundary, or the full path"),
    "not": {"pattern": r"/$|^\./|//"},
}
_MODULE = _string("the loaded file's module name, exactly", _ecma(L._MODULE))
_ONE_OF_PATH_MODULE = {"oneOf": [{"required": ["path"]}, {"required": ["module"]}]}


def _targets() -> Schema:
    return _table(
        "targets",
        {
            "names": _strings("exact target names (default: every target that reports)", {}),
            "replicas_of": _strings(
                "target families whose every instance (FAMILY/<pod or container>, the agent's "
                "--instance) the run covers; min_targets counts them",
                {"pattern": _ecma(L._FAMILY)},
            ),
            "container_ids": _strings(
                "container id prefixes, 12 to 64 lowercase hex digits",
                {"pattern": _ecma(L._CONTAINER)},
            ),
            "min_targets": {
                "type": "integer",
                "minimum": 1,
                "default": I.DEFAULT_MIN_TARGETS,
                "description": "with fewer selected targets reporting, the run is PENDING",
            },
            "containers": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {
                    **_string(
                        "the container every process of the target must run in: a name, an "
                        "id prefix or label:KEY=VALUE",
                        _CONTAINER_SPEC,
                    ),
                },
                "description": "target name = the container that serves it",
            },
        },
        "which reporting targets the run covers",
    )


def _evidence() -> Schema:
    def unsafe(what: str) -> Schema:
        return {"type": "boolean", "default": False, "description": f"UNSAFE: {what}"}

    return _table(
        "evidence",
        {
            "freshness_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "default": I.DEFAULT_FRESHNESS_S,
                "description": "an older latest report makes the target STALE (seconds)",
            },
            "clock_skew_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "default": I.DEFAULT_CLOCK_SKEW_S,
                "description": "a report dated further than this from its receipt is never fresh",
            },
            "min_steps": {
                "type": "integer",
                "minimum": 1,
                "default": I.DEFAULT_MIN_STEPS,
                "description": "productive steps before a process's liveness can PASS or FAIL",
            },
            "require_probe": {
                **_strings("roles whose processes must carry the probe", {"enum": list(I.ROLES)}),
                "default": list(I.DEFAULT_REQUIRE_PROBE),
            },
            "unsafe_allow_unauthenticated": unsafe("evidence nobody vouches for may PASS"),
            "unsafe_allow_no_liveness": unsafe("accept a policy with no [runner] and no hooks"),
            "unsafe_allow_zero_fires": unsafe("accept hooks that need no fire on a step"),
        },
        "how fresh and complete the evidence must be",
    )


def _runner() -> Schema:
    return _table(
        "runner",
        {
            "expect_class": _string(
                "qualified class name of the live runner object", _ecma(L._QUALNAME)
            ),
            "witness": {
                "type": "boolean",
                "default": False,
                "description": "also require the agent's stack samples in the step file",
            },
        },
        "the model runner that must be live",
        required=["expect_class"],
    )


def _hooks() -> Schema:
    hook = _table(
        "hooks",
        {
            "name": _string("the hook name the probe reports"),
            "target": _string(
                "what the hook must wrap, module:qualname as the probe records it "
                "(VERIFIER_HOOKS' target without its @device or @first, or a decorated "
                "function's module:qualname): a hook of that name on anything else is "
                "liveness.hook.target_mismatch",
                _ecma(L.HOOK_TARGET),
            ),
            "role": _enum(I.STEP_ROLES, "only processes of this role (only they run steps)"),
            "min_fires_per_productive_step": {
                "type": "number",
                "minimum": 0,
                "default": I.DEFAULT_MIN_FIRES_PER_PRODUCTIVE_STEP,
                "description": "fires per judged step",
            },
            "on": {**_enum(I.HOOK_PHASES, "the steps it is judged on"), "default": "productive"},
            "count": {**_enum(I.HOOK_COUNTS, "what is counted"), "default": "python"},
        },
        "a hook that must fire",
        required=["name"],
        **{
            "if": {"required": ["count"], "properties": {"count": {"const": "device"}}},
            "then": {"required": ["on"], "properties": {"on": {"const": "productive"}}},
        },
    )
    return _entries(hook, "hooks that must fire, and how often")


def _files(key: str, description: str) -> Schema:
    props: Schema = {"path": _PATH, "module": _MODULE, "role": _ROLE}
    if key == "files":
        props["sha256"] = _SHA256
    return _entries(_table(key, props, description, **_ONE_OF_PATH_MODULE), description)


def _provenance() -> Schema:
    return _table(
        "provenance",
        {
            "pristine": _strings(
                "distributions whose every loaded file must match its RECORD",
                {"pattern": _ecma(L._DISTRIBUTION)},
            ),
            "allow": _strings(
                "drift ids reported as WARNING instead of ERROR", {"enum": list(ALLOWABLE_DRIFT)}
            ),
            "unsafe_allow_unpinned_serving_package": {
                "type": "boolean",
                "default": False,
                "description": "UNSAFE: accept pristine without vLLM's distribution",
            },
            "all_code_claimed": {
                "type": "boolean",
                "default": False,
                "description": "every code file a judged process ran must be claimed: pristine "
                "in any RECORD, stdlib, a [[patches]] or [[claims]] entry, or generated",
            },
            "only_distributions": _strings(
                "the only distributions whose files a judged process may load",
                {"pattern": _ecma(L._DISTRIBUTION)},
            ),
        },
        "which distributions must be as published",
    )


def _patches() -> Schema:
    patch = _table(
        "patches",
        {
            "distribution": _string(
                "a distribution listed in provenance.pristine", _ecma(L._DISTRIBUTION)
            ),
            "path": {
                **_string("the file's path as the distribution's RECORD writes it"),
                "not": {"pattern": r"^/|(^|/)\.\.(/|$)"},
            },
            "sha256": _SHA256,
            "note": {"type": "string", "description": "why this patch exists"},
        },
        "a file allowed to differ from its RECORD",
        required=["distribution", "path", "sha256"],
    )
    return _entries(patch, "files allowed to differ from their RECORD")


def _claims() -> Schema:
    claim = _table(
        "claims",
        {
            "path": {
                **_string('an absolute path, a suffix at a "/" boundary, or "-c"'),
                "not": {"pattern": r"^/*$|//|(^|/)\.\.?(/|$)"},
            },
            "sha256": _SHA256,
            "note": {"type": "string", "description": "who vouches for these bytes"},
        },
        "bytes vouched for at a path no distribution pins: a code file (with "
        "all_code_claimed), a .pth that executes code, the code set on a loader instance",
        required=["path", "sha256"],
    )
    return _entries(claim, "code files claimed by their bytes")


def _distributions() -> Schema:
    pin = _table(
        "distributions",
        {
            "name": _string("a distribution listed in provenance.pristine", _ecma(L._DISTRIBUTION)),
            "version": {
                **_string("its version, as its METADATA writes it"),
                "pattern": r"^\S(.*\S)?$",
            },
            "content_sha256": {
                **_SHA256,
                "description": "its content digest (verifier policy pin-wheel, policy init)",
            },
            "note": {"type": "string", "description": "where the pin comes from"},
        },
        "the version and content a pristine distribution must have",
        required=["name", "version"],
    )
    return _entries(pin, "pristine distributions pinned to what was published")


def build() -> Schema:
    """The schema, as shipped in ``policy.schema.json``."""
    liveness = [{"required": [k]} for k in ("runner", "hooks", "files", "forbid")]
    pristine = {
        "required": ["provenance"],
        "properties": {"provenance": {"required": ["pristine"]}},
    }
    top = _table(
        "",
        {
            "version": {
                "type": "integer",
                "const": L.VERSION,
                "description": "the policy format's version",
            },
            "targets": _targets(),
            "evidence": _evidence(),
            "runner": _runner(),
            "hooks": _hooks(),
            "files": _files("files", "files that must be loaded"),
            "forbid": _files("forbid", "files that must not be loaded"),
            "provenance": _provenance(),
            "patches": _patches(),
            "claims": _claims(),
            "distributions": _distributions(),
        },
        "A verifier policy (docs/policy.md); `verifier policy check` is the authority.",
        required=["version"],
        anyOf=[*liveness, pristine],  # a policy without a rule would pass anything
    )
    return {"$schema": DRAFT, "title": "verifier policy", **top}


def text() -> str:
    """``build()`` as the shipped file holds it."""
    return json.dumps(build(), indent=2) + "\n"
