"""``[[hooks]]``: did a declared hook fire on the steps that were measured.

Counted in Python (the wrapper's fires, split by the phase of the step they fell in) or, with
``count = "device"``, on the hook's device-side counter, the count that keeps advancing where a
captured CUDA graph replays the hooked code without running its Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from servewitness.model import Finding, HookCount, HookEvidence, ProcessReport, Severity
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I

# The mode suffixes a VERIFIER_HOOKS target may carry (the probe records one at most).
MODE_SUFFIXES = ("@device", "@first")


def code_target(target: str) -> str:
    """The code a recorded hook target names: TARGET without its one mode suffix
    (``m:f@device`` -> ``m:f``). The mode says how the code's calls are counted, which the
    policy judges apart (``count``, the fire rules); a pin names the code. One suffix only:
    ``m:f@first@device`` (which the probe refuses to declare) becomes ``m:f@first``, no pin's."""
    for suffix in MODE_SUFFIXES:
        if target.endswith(suffix):
            return target.removesuffix(suffix)
    return target


def _hook_owner(h: HookEvidence) -> str:
    if h.owner:
        return h.owner
    target = code_target(h.target)
    module, _, qualname = target.partition(":")
    cls = qualname.rpartition(".")[0]
    return f"{module}.{cls}" if cls else target


def _graph_note(p: ProcessReport) -> str | None:
    """The compile / CUDA-graph mode P's steps ran in, when it is not plain eager."""
    s = p.steps
    if s is None:
        return None
    modes = [m for m in (s.compilation_mode, s.cudagraph_mode) if m and m != "NONE"]
    return " / ".join(modes) or None


def _graph_hint(graphs: str | None) -> str:
    if not graphs:
        return ""
    return (
        f"; its steps ran compiled or replayed as CUDA graphs ({graphs}), where Python inside "
        "the compiled or captured region runs at tracing or capture only: count it on the "
        'device (@device, count = "device")'
    )


@dataclass(frozen=True)
class HookFires:
    """``[[hooks]]``: the hook fires on (a share of) the productive steps of every process of
    its role, each process (each tensor-parallel rank) judged against its own step count."""

    name: str
    role: str | None = None  # None: the processes that run steps
    min_fires_per_productive_step: float = I.DEFAULT_MIN_FIRES_PER_PRODUCTIVE_STEP
    on: str = "productive"  # the steps judged: productive | decode | prefill
    count: str = "python"  # python: the wrapper's fires | device: its device-side counter
    # What the hook must wrap ("module:qualname", as the probe records it without a mode
    # suffix: a pin names code, @device / @first say how it is counted); None: any target.
    target: str | None = None

    def describe(self) -> str:
        return (
            f"[[hooks]] {self.name}"
            + ("" if self.on == "productive" else f" on {self.on}")
            + ("" if self.count == "python" else f" counted on the {self.count}")
        )

    def _phase(self, p: ProcessReport, h: HookEvidence | None) -> tuple[int, int]:
        """(steps of the judged kind, the hook's fires on them) in process P."""
        s = p.steps
        if self.on == "decode":
            return (s.decode_steps if s else 0), (h.fired_decode if h else 0)
        if self.on == "prefill":
            return (s.prefill_steps if s else 0), (h.fired_prefill if h else 0)
        return E.productive(p), (h.fired_productive if h else 0)

    def _scope(
        self, snapshot: I.TargetSnapshot, ctx: I.EvalContext
    ) -> tuple[list[ProcessReport], list[Finding]]:
        if self.role is None:
            return E.steppers(snapshot, ctx, self.describe())
        return E.of_role(snapshot, ctx, self.role, self.describe())

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = self._scope(snapshot, ctx)
        for p in E.probed(procs):
            out.extend(self._judge(p, snapshot, ctx))
        return out

    def hook_counts(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[HookCount]:
        out = []
        for p in E.probed(self._scope(snapshot, ctx)[0]):
            h = next((h for h in p.hooks if h.name == self.name), None)
            out.append(
                HookCount(
                    name=self.name,
                    pid=p.key.pid,
                    role=p.role,
                    rank=p.rank,
                    fired=h.fired if h else 0,
                    fired_productive=h.fired_productive if h else 0,
                    productive_steps=E.productive(p),
                    total_steps=E.total(p),
                    fired_decode=h.fired_decode if h else 0,
                    decode_steps=p.steps.decode_steps if p.steps else 0,
                    fired_prefill=h.fired_prefill if h else 0,
                    prefill_steps=p.steps.prefill_steps if p.steps else 0,
                    fired_outside=h.fired_outside if h else 0,
                    on=self.on,
                    min_fires_per_step=self.min_fires_per_productive_step,
                )
            )
        return out

    def _judge(self, p: ProcessReport, snap: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        h = next((h for h in p.hooks if h.name == self.name), None)
        s = self._phase(p, h)[0]
        enough = E.productive(p) >= ctx.min_steps and (self.on == "productive" or s > 0)
        live = p.runner.cls if p.runner is not None else None
        context: dict[str, Any] = {
            **E.base(p),
            "hook": self.name,
            "target": h.target if h else None,
            "on": self.on,
            "fired": h.fired if h else 0,
            "fired_productive": h.fired_productive if h else 0,
            "fired_decode": h.fired_decode if h else 0,
            "fired_prefill": h.fired_prefill if h else 0,
            "fired_outside_steps": h.fired_outside if h else 0,
            "productive_steps": E.productive(p),
            "decode_steps": p.steps.decode_steps if p.steps else 0,
            "prefill_steps": p.steps.prefill_steps if p.steps else 0,
            "total_steps": E.total(p),
            "min_steps": ctx.min_steps,
            "min_fires_per_productive_step": self.min_fires_per_productive_step,
            "live_runner": live,
        }
        where = E.name(p)
        if self.target is not None and h is not None and code_target(h.target) != self.target:
            # Known at once, whatever the steps: the name is on other code than the policy's.
            context["pinned_target"] = self.target
            return [
                E.finding(
                    F.HOOK_TARGET_MISMATCH,
                    Severity.ERROR,
                    f"hook {self.name} in {where} wraps {h.target or '(no target: fired by name)'}"
                    f", not {self.target} as the policy pins: its fires say nothing of that code",
                    snap,
                    **context,
                )
            ]
        decided = self._decided(h, where, live)
        if decided is not None:
            severity = Severity.ERROR if enough else Severity.PENDING
            found = [E.finding(decided[0], severity, decided[1], snap, **context)]
            return found if enough else [*found, E.insufficient(p, snap, ctx)]
        if h is None or not enough:  # h is never None here: _decided took that case
            return [E.insufficient(p, snap, ctx)]
        if self.count == "device":
            return self._judge_device(p, h, snap, ctx, context)
        return self._judge_python(p, h, snap, context)

    def _judge_python(
        self, p: ProcessReport, h: HookEvidence, snap: I.TargetSnapshot, context: dict[str, Any]
    ) -> list[Finding]:
        """The Python fires on the judged steps, with enough steps and the hook decided."""
        s, fires = self._phase(p, h)
        kind = "productive" if self.on == "productive" else self.on
        where = E.name(p)
        graphs = _graph_note(p)
        if graphs:
            context["graph_mode"] = graphs
        if h.fired == 0:
            return [
                E.finding(
                    F.HOOK_NOT_FIRING,
                    Severity.ERROR,
                    f"hook {self.name} never fired in {where} although it ran {s} {kind} "
                    f"steps ({E.total(p)} in all){_graph_hint(graphs)}",
                    snap,
                    **context,
                )
            ]
        if fires == 0 and h.fired == h.fired_outside:
            return [
                E.finding(
                    F.HOOK_OUTSIDE_STEPS_ONLY,
                    Severity.ERROR,
                    f"hook {self.name} fired {h.fired} times in {where}, all outside engine "
                    f"steps (start-up, warm-up or graph capture), and never on its {s} {kind} "
                    f"steps{_graph_hint(graphs)}",
                    snap,
                    **context,
                )
            ]
        ratio = fires / s
        context["ratio"] = ratio
        if h.how == "first_hit":  # it fires once by design: one fire on the judged steps
            context["first_hit"] = True
            low = fires < 1
        else:
            low = ratio < self.min_fires_per_productive_step
        if low:
            return [
                E.finding(
                    F.HOOK_FIRE_RATIO_LOW,
                    Severity.ERROR,
                    f"hook {self.name} fired on {fires} of {s} {kind} steps in "
                    f"{where} ({ratio:.2f} per step; the policy needs "
                    f"{self.min_fires_per_productive_step:g})",
                    snap,
                    **context,
                )
            ]
        return [
            E.finding(
                F.HOOK_FIRING,
                Severity.INFO,
                f"hook {self.name} fired {h.fired} times in {where}, {fires} of them "
                f"on its {s} {kind} steps",
                snap,
                **context,
            )
        ]

    def _judge_device(
        self,
        p: ProcessReport,
        h: HookEvidence,
        snap: I.TargetSnapshot,
        ctx: I.EvalContext,
        context: dict[str, Any],
    ) -> list[Finding]:
        """``count = "device"``: the device counter's advance over the productive steps since
        the probe read its base, right after the first productive step. What it counted
        before (warm-up, profiling, graph capture run the hooked code too) is left out."""
        where = E.name(p)
        context.update(device_fired=h.device_fired, device_base=h.device_base,
                       device_base_step=h.device_base_step)  # fmt: skip
        if h.device_fired is None:
            return [
                E.finding(
                    F.HOOK_NO_DEVICE_COUNTER,
                    Severity.ERROR,
                    f"hook {self.name} has no device counter in {where} (fired {h.fired} times "
                    f"in Python on {E.productive(p)} productive steps): the policy counts it on "
                    "the device; declare it name=module:Qual.method@device or use "
                    "hook.device_counter",
                    snap,
                    **context,
                )
            ]
        since = h.device_on_steps()
        steps = E.productive(p) - since[1] if since is not None else 0
        if since is None or steps < max(ctx.min_steps, 1):
            return [E.insufficient(p, snap, ctx)]
        fires = since[0]
        ratio = fires / steps
        context.update(device_fires_on_steps=fires, steps_judged=steps, ratio=ratio)
        counted = (
            f"its device counter advanced {fires} on the {steps} productive steps after the "
            f"first in {where} ({ratio:.2f} per step; {h.device_base} counted before, in "
            f"warm-up, profiling or capture; {h.fired} Python fires)"
        )
        if fires == 0:
            return [E.finding(F.HOOK_NOT_FIRING, Severity.ERROR,
                              f"hook {self.name}: {counted}", snap, **context)]  # fmt: skip
        if ratio < self.min_fires_per_productive_step:
            return [
                E.finding(
                    F.HOOK_FIRE_RATIO_LOW,
                    Severity.ERROR,
                    f"hook {self.name}: {counted}; the policy needs "
                    f"{self.min_fires_per_productive_step:g}",
                    snap,
                    **context,
                )
            ]
        return [E.finding(F.HOOK_FIRING, Severity.INFO, f"hook {self.name}: {counted}",
                          snap, **context)]  # fmt: skip

    def _decided(
        self, h: HookEvidence | None, where: str, live: str | None
    ) -> tuple[str, str] | None:
        """The statuses that need no steps to decide: PENDING until min_steps, ERROR after."""
        if h is None:
            return (
                F.HOOK_NOT_DECLARED,
                f"hook {self.name} is not declared in {where}: the probe there was not told "
                "about it (VERIFIER_HOOKS or hook.fire)",
            )
        if not h.module_loaded:
            module = h.target.partition(":")[0] or "(none)"
            return (
                F.HOOK_NOT_LOADED,
                f"hook {self.name} never fired in {where}: its module {module} was never "
                "imported there",
            )
        if h.unresolved is not None:
            return (
                F.HOOK_UNRESOLVED,
                f"hook {self.name} never fired in {where}: its module was imported but its "
                f"target was not found ({h.unresolved})",
            )
        if h.how == "method" and h.instantiated_class is None:
            runner = f"the live runner is {live}" if live else "no live runner is recorded"
            if h.fired == 0:
                return (
                    F.HOOK_NOT_INSTANTIATED,
                    f"hook {self.name} never fired in {where}: its class {_hook_owner(h)} was "
                    f"never instantiated; {runner}",
                )
            # An instance method's fires with no instance of its class ever made: a call on
            # an object made without its constructor, or a count written from elsewhere.
            return (
                F.HOOK_NOT_INSTANTIATED,
                f"hook {self.name} fired {h.fired} times in {where}, but its class "
                f"{_hook_owner(h)} was never instantiated (an instance method runs on an "
                f"instance): not the live path; {runner}",
            )
        return None
