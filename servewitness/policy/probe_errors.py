"""Which of a probe's own errors touch evidence the policy judges.

The probe never raises into vLLM: when its own code fails (a step it could not count, a hook
fire it could not record, an import whose bytes it could not hash) it records an error,
tagged with where it happened (``[where] message`` in the report), and vLLM goes on. What it
failed to record is then missing from the evidence, and a missing count reads like a true
zero. On the H200 the V2 runner's speculation path raised on every step (3,270 errors in
12 s), the probe counted 0 drafts, and the run still passed with a warning.

So an error in evidence that the verdict rests on is ``evidence.probe_errors.judged``
(ERROR: never PASS, the error named); the rest stay ``evidence.probe_errors`` (a warning,
named in the verdict and in every seal taken while it stands). By the error's ``where``:

- liveness, always judged: the step accounting (``steps``, ``spec``, ``bindings``: steps,
  speculation and which request each step served), the probe's own state (``state``,
  ``start``, ``fork``) and the runner's wrappers (``Class.method``);
- hooks, judged when the error names a hook the policy declares (``'name': ...``), or names
  no hook at all (``device_counter`` ``read:``, every device counter at once);
- loaded files, judged when the policy judges provenance (any ``[runner]``, ``[[files]]``,
  ``[[forbid]]`` or ``[provenance]`` rule): ``imports``, ``loaders``, ``zipimport``,
  ``pth``, ``code``, ``sweeper``, ``first_hit``;
- not judged: ``VERIFIER_HOOKS`` (the declaration itself; a declared hook it broke never
  fires, which the hook rule judges), ``vllm_log`` (log capture) and ``trace`` (a trace or
  profile function set after the early probe started: a debugger, vLLM's
  ``VLLM_TRACE_FUNCTION``; said in every verdict, not judged). An audit hook added after it
  is ``imports``: judged; except ``audit_hook``, one the agent found added by code in a file
  pristine against its distribution's RECORD (filelock adds one at import, to guard its
  locks across ``fork``): said in every verdict, not judged. ``children`` (past the probe's
  bound of journaled children, more were started): said, not judged; a child not journaled
  is not taken as its parent's choice anyway (``rules_claims._started_by``), which fails
  closed.

A ``where`` this table does not know is judged: a new kind of probe error fails closed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

LIVENESS = frozenset({"steps", "spec", "bindings", "state", "start", "fork"})
HOOKS = frozenset({"hooks", "hook.fire", "hook.decorate", "hook.device_counter", "device_counter"})
FILES = frozenset({"imports", "loaders", "zipimport", "pth", "code", "sweeper", "first_hit"})
UNJUDGED = frozenset({"VERIFIER_HOOKS", "vllm_log", "trace", "audit_hook", "children"})

_TAGGED = re.compile(r"\[([^\]]{1,200})\] ?(.*)", re.DOTALL)
_HOOK_NAME = re.compile(r"""^'([^']{1,200})'""")
_METHOD = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")  # a runner wrapper: Class.method


@dataclass(frozen=True)
class ProbeError:
    where: str
    message: str
    area: str  # liveness, hooks, files, unjudged or unknown
    judged: bool


def split(text: str) -> tuple[str, str]:
    """``[where] message`` into its two parts (where ``""`` when untagged)."""
    m = _TAGGED.fullmatch(text)
    return (m.group(1), m.group(2)) if m else ("", text)


def area(where: str) -> str:
    if where in LIVENESS or (_METHOD.match(where) and where not in HOOKS | FILES):
        return "liveness"
    if where in HOOKS:
        return "hooks"
    if where in FILES:
        return "files"
    if where in UNJUDGED:
        return "unjudged"
    return "unknown"


def classify(text: str, hooks: frozenset[str], files_judged: bool) -> ProbeError:
    """One recorded error, judged or not under a policy that declares HOOKS and judges
    loaded files when FILES_JUDGED."""
    where, message = split(text)
    kind = area(where)
    if kind == "hooks":
        named = _HOOK_NAME.match(message)
        judged = named is None or named.group(1) in hooks
    elif kind == "files":
        judged = files_judged
    else:
        judged = kind != "unjudged"
    return ProbeError(where, message, kind, judged)


def judged(
    errors: Iterable[str], hooks: frozenset[str], files_judged: bool
) -> tuple[list[ProbeError], list[ProbeError]]:
    """ERRORS split into (judged, the rest), each in recorded order."""
    yes: list[ProbeError] = []
    no: list[ProbeError] = []
    for text in errors:
        e = classify(text, hooks, files_judged)
        (yes if e.judged else no).append(e)
    return yes, no
