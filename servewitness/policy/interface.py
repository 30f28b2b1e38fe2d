"""The policy seam: value types, the rule protocol and the one error type. The finding ids
and what each means are in ``findings.py``.

A policy is a tuple of small rule objects (``rules.py``) that the engine (``engine.py``) runs
against the latest evidence of each target. Every rule fails closed: evidence it needs and does
not have gives a ``PENDING`` finding, never silence, so absence of evidence is never ``PASS``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from servewitness.errors import ConfigError
from servewitness.model import ContainerInfo, Finding, HookCount, ProcessKey, ProcessReport
from servewitness.policy.vouch import Claim, Patch

# Roles a process can have (``ProcessReport.role``). Helpers and unknown processes are ignored
# unless a rule names their role. ``offline``: the front end of vllm.LLM in a script (no API
# server; in one process it is the engine core and worker too, and reported as ``worker``).
ROLES = ("api_server", "offline", "engine_core", "worker", "helper", "unknown")
IGNORED_ROLES = frozenset({"helper", "unknown"})
# Roles whose processes run engine steps (hooks are judged against their own step counts).
STEP_ROLES = ("engine_core", "worker")
DEFAULT_REQUIRE_PROBE = ("api_server", "engine_core", "worker")
DEFAULT_FRESHNESS_S = 10.0
# How far the agent's wall clock may be from the verifier's before its report is not fresh.
DEFAULT_CLOCK_SKEW_S = 30.0
DEFAULT_MIN_STEPS = 1
DEFAULT_MIN_TARGETS = 1
DEFAULT_MIN_FIRES_PER_PRODUCTIVE_STEP = 1.0

# Which steps a [[hooks]] entry judges its fires against (its ``on``).
HOOK_PHASES = ("productive", "decode", "prefill")
# What a [[hooks]] entry counts: the Python fires (the default) or the hook's device-side
# counter (``@device`` / ``hook.device_counter``), which advances on every replay of a
# captured graph where the Python code does not run.
HOOK_COUNTS = ("python", "device")


class PolicyError(ConfigError):
    """A policy that cannot be loaded: ``<source>:<line>: <key>: <what is wrong>``.

    ``line`` is None only when no line can be named (a required key that is missing from the
    top level, an empty policy); ``key`` is None for TOML syntax errors and whole-file problems.
    Keys are dotted paths; ``hooks[2].nmae`` is key ``nmae`` of the second ``[[hooks]]`` entry
    (entries are counted from 1, as a reader counts them in the file).
    """

    def __init__(self, source: str, line: int | None, key: str | None, what: str) -> None:
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {what}" if key is None else f"{where}: {key}: {what}")
        self.source = source
        self.line = line
        self.key = key
        self.what = what


class WeakPolicyError(PolicyError):
    """A policy that parses but could PASS on nothing and does not say so (``strength.py``):
    ``flags`` are the dotted ``unsafe_*`` keys that would accept its open weakenings, so a
    verdict on a run stored under it can name them (``policy.refused``)."""

    def __init__(self, source: str, what: str, flags: tuple[str, ...]) -> None:
        super().__init__(source, None, None, what)
        self.flags = flags


@dataclass(frozen=True)
class TargetSnapshot:
    """The latest evidence for one target."""

    target: str  # target name as the agent reports it
    processes: tuple[ProcessReport, ...]  # ``files`` already resolved (never None here)
    received_unix: float  # when the verifier received the report
    container_ids: tuple[str, ...] = ()  # distinct ProcessReport.container_id values
    # How old the evidence was when the agent sent it (``TargetReport.collect_s``: its boot
    # clock's age, or its wall-clock span where larger or the agent measured none).
    collect_s: float = 0.0
    containers: tuple[ContainerInfo, ...] = ()  # what the agent found about those containers
    unobservable: tuple[str, ...] = ()  # what the agent could not see (TargetReport.unobservable)
    # How the report was authenticated ("agent NAME" over mTLS or a token, "unix:uid=U,pid=P":
    # a listed uid on the verifier's Unix socket); None: nobody vouches for who sent it.
    authenticated_as: str | None = "local"
    # When the verifier received it on its age clock (``servewitness.server.clock``: seconds since
    # boot, which cannot be stepped back); None: not known to this verifier (stored before it
    # started). The verifier judges freshness on this clock, never on wall-clock differences.
    received_boot_s: float | None = None
    # The agent's wall clock when it sent the report (``TargetReport.sent_unix``); None: not
    # known (evaluated offline). Against ``received_unix`` it gives the two clocks' skew.
    sent_unix: float | None = None
    # Roots of independent vLLM process trees the agent saw under this target
    # (``TargetReport.mixed_roots``): two servers under one name.
    mixed_roots: tuple[ProcessKey, ...] = ()
    # False: the agent said it could not measure collect_s on its boot clock (the report was
    # read before its host rebooted): the evidence has no known age, never fresh.
    age_known: bool = True
    # The longest the report can have been on the way before its receipt
    # (``server/nonces.py``: bounded by the nonce it carried): its evidence is dated by the
    # receipt less this and less its age, so no delay makes evidence look newer than it is.
    transit_s: float = 0.0

    @functools.cached_property
    def every_container_id(self) -> tuple[str, ...]:
        """Its container ids, then its processes' not among them, each once in order (what a
        policy's selection matches): computed once, not on every status call."""
        seen = dict.fromkeys(self.container_ids)
        seen.update(dict.fromkeys(p.container_id for p in self.processes if p.container_id))
        return tuple(seen)

    @functools.cached_property
    def most_productive(self) -> int:
        """The most productive steps any of its processes ran (0 with none): rules ask it once
        per process, so it is computed once (asked of every process each time, a status call
        on a report of 4,096 processes took 10 s)."""
        return max((p.steps.productive for p in self.processes if p.steps is not None), default=0)

    @property
    def evidence_boot_s(self) -> float | None:
        """When the agent read the evidence, on the verifier's age clock (None: unknown)."""
        if self.received_boot_s is None or not self.age_known:
            return None
        return self.received_boot_s - self.transit_s - self.collect_s

    @property
    def clock_skew_s(self) -> float | None:
        """The agent's wall clock minus the verifier's at receipt (network time included)."""
        return None if self.sent_unix is None else self.sent_unix - self.received_unix

    @property
    def evidence_unix(self) -> float:
        """When the agent read the evidence, on the verifier's clock: receipt minus the agent's
        collection time and the report's time on the way. Freshness and window seals date
        evidence by this, not by receipt: a report that spent seconds hashing files carries
        counters from its start. Never before the epoch: an age older than that (a lie, or a
        wall clock years ahead) made a date no client accepts, and every status answer naming
        the target unreadable."""
        return max(0.0, self.received_unix - self.transit_s - self.collect_s)


@dataclass(frozen=True)
class TargetSelection:
    """``[targets]``: which reporting targets a run covers."""

    names: tuple[str, ...] = ()  # empty (and no replicas_of): every target that reports
    container_ids: tuple[str, ...] = ()  # prefixes (>= 12 characters); empty: any container
    min_targets: int = DEFAULT_MIN_TARGETS
    # families whose every instance (FAMILY/<pod or container>) the run covers
    # (servewitness.instances); min_targets counts them
    replicas_of: tuple[str, ...] = ()
    # [targets.containers]: target name (or a replicas_of family, for each of its instances)
    # -> the container its evidence must come from: a container name, an id prefix (>= 12
    # hex digits) or "label:KEY=VALUE"
    containers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EvidenceSettings:
    """``[evidence]``: how fresh and how much evidence a verdict needs."""

    freshness_s: float = DEFAULT_FRESHNESS_S
    # A report whose sent time (the agent's clock) is further than this from the verifier's
    # receipt time is dated by no clock both agree on: evidence.clock_skew, never fresh.
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S
    min_steps: int = DEFAULT_MIN_STEPS
    require_probe: tuple[str, ...] = DEFAULT_REQUIRE_PROBE
    # Accept evidence nobody vouches for (plaintext TCP). Named unsafe: a PASS then says
    # nothing about who sent the evidence, and the verdict names the flag (policy.unsafe).
    unsafe_allow_unauthenticated: bool = False
    # Accept a policy with no liveness rule ([runner], [[hooks]]): it can PASS a process that
    # ran zero productive steps with zero hook fires (``strength.py``).
    unsafe_allow_no_liveness: bool = False
    # Accept a policy whose only liveness rules are Python-counted [[hooks]] with
    # min_fires_per_productive_step = 0: they PASS with zero fires on the steps they judge.
    unsafe_allow_zero_fires: bool = False


@dataclass(frozen=True)
class ProvenanceSettings:
    """``[provenance]``: drift ids downgraded to warnings, and whether the policy accepts not
    requiring the serving package (vLLM's distribution) pristine."""

    allow: tuple[str, ...] = ()
    # Accept a policy whose [provenance] pristine names no vLLM distribution: the serving
    # code's files are then never compared with what was published (``strength.py``).
    unsafe_allow_unpinned_serving_package: bool = False
    # [[claims]] and [[patches]]: the bytes that account for drift (``DriftFree``)
    claims: tuple[Claim, ...] = ()
    patches: tuple[Patch, ...] = ()


@dataclass(frozen=True)
class EvalContext:
    """What every rule may read besides the snapshot."""

    min_steps: int = DEFAULT_MIN_STEPS
    require_probe: tuple[str, ...] = DEFAULT_REQUIRE_PROBE


class Rule(Protocol):
    """One policy rule. ``evaluate`` never raises on odd evidence: it says so in findings."""

    def describe(self) -> str:
        """How the rule reads in a message, e.g. ``[[hooks]] v1_step``."""
        ...

    def evaluate(self, snapshot: TargetSnapshot, ctx: EvalContext) -> list[Finding]: ...


@runtime_checkable
class CountsHooks(Protocol):
    """A rule that also reports the fire counts it judged (``TargetVerdict.hooks``): one per
    process it judged a hook in, fires next to that process's steps, even when zero."""

    def hook_counts(self, snapshot: TargetSnapshot, ctx: EvalContext) -> list[HookCount]: ...
