"""The policy seam: value types, the rule protocol, the finding ids and the one error type.

A policy is a tuple of small rule objects (``rules.py``) that the engine (``engine.py``) runs
against the latest evidence of each target. Every rule fails closed: evidence it needs and does
not have gives a ``PENDING`` finding, never silence, so absence of evidence is never ``PASS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from verifier.errors import ConfigError
from verifier.model import (
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_IDS,
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_MODULE_FILELESS,
    DRIFT_MODULE_SHADOWED,
    DRIFT_RECORD_UNREADABLE,
    ContainerInfo,
    Finding,
    HookCount,
    ProcessReport,
    Severity,
)

# Roles a process can have (``ProcessReport.role``). Helpers and unknown processes are ignored
# unless a rule names their role. ``offline``: the front end of vllm.LLM in a script (no API
# server; in one process it is the engine core and worker too, and reported as ``worker``).
ROLES = ("api_server", "offline", "engine_core", "worker", "helper", "unknown")
IGNORED_ROLES = frozenset({"helper", "unknown"})
# Roles whose processes run engine steps (hooks are judged against their own step counts).
STEP_ROLES = ("engine_core", "worker")
DEFAULT_REQUIRE_PROBE = ("api_server", "engine_core", "worker")
DEFAULT_FRESHNESS_S = 10.0
DEFAULT_MIN_STEPS = 1
DEFAULT_MIN_TARGETS = 1
DEFAULT_MIN_FIRES_PER_PRODUCTIVE_STEP = 1.0

# Finding ids. Stable: tools and people match on them.
EVIDENCE_STALE = "evidence.stale"
EVIDENCE_NO_REPORT = "evidence.no_report"
EVIDENCE_NO_PROCESSES = "evidence.no_processes"
EVIDENCE_PROBE_ABSENT = "evidence.probe_absent"
EVIDENCE_PROBE_ERRORS = "evidence.probe_errors"
EVIDENCE_UNPROBED = "evidence.unprobed"
EVIDENCE_MANIFEST_UNRESOLVED = "evidence.manifest_unresolved"
EVIDENCE_ROLE_MISSING = "evidence.role_missing"
EVIDENCE_DISAGREEMENT = "evidence.disagreement"
EVIDENCE_CONTAINER_MISMATCH = "evidence.container_mismatch"
EVIDENCE_CONTAINER_UNKNOWN = "evidence.container_unknown"
EVIDENCE_UNOBSERVABLE = "evidence.unobservable"
EVIDENCE_UNAUTHENTICATED = "evidence.unauthenticated"
NATIVE_REPLACED = "provenance.native.replaced"
NATIVE_DELETED = "provenance.native.deleted"
NATIVE_UNREADABLE = "provenance.native.unreadable"
STEPS_INSUFFICIENT = "liveness.steps.insufficient"
STEPS_RAISED = "liveness.steps.raised"
HOOK_NOT_DECLARED = "liveness.hook.not_declared"
HOOK_NOT_LOADED = "liveness.hook.not_loaded"
HOOK_UNRESOLVED = "liveness.hook.unresolved"
HOOK_NOT_INSTANTIATED = "liveness.hook.not_instantiated"
HOOK_NOT_FIRING = "liveness.hook.not_firing"
HOOK_FIRE_RATIO_LOW = "liveness.hook.fire_ratio_low"
HOOK_OUTSIDE_STEPS_ONLY = "liveness.hook.outside_steps_only"
HOOK_PHASES = ("productive", "decode", "prefill")
# What a [[hooks]] entry counts: the Python fires (the default) or the hook's device-side
# counter (``@device`` / ``hook.device_counter``), which advances on every replay of a
# captured graph where the Python code does not run.
HOOK_COUNTS = ("python", "device")
HOOK_NO_DEVICE_COUNTER = "liveness.hook.no_device_counter"
HOOK_FIRING = "liveness.hook.firing"
RUNNER_UNKNOWN = "liveness.runner.unknown"
RUNNER_UNEXPECTED = "liveness.runner.unexpected"
RUNNER_UNWITNESSED = "liveness.runner.unwitnessed"
RUNNER_WITNESSED = "liveness.runner.witnessed"
FILE_NOT_LOADED = "provenance.file.not_loaded"
FILE_HASH_MISMATCH = "provenance.file.hash_mismatch"
FILE_UNVERIFIABLE = "provenance.file.unverifiable"
FILE_FORBIDDEN = "provenance.file.forbidden"
PROVENANCE_UNJUDGED = "provenance.unjudged"
PROVENANCE_ORIGINS = "provenance.origins"
PROVENANCE_NOT_PRISTINE = "provenance.not_pristine"
PROVENANCE_NOT_LOADED = "provenance.distribution.not_loaded"
PATCH_DECLARED = "provenance.patch.declared"
PATCH_UNDECLARED = "provenance.patch.undeclared"
PATCH_NOT_APPLIED = "provenance.patch.not_applied"
# Always WARNING, so never in [provenance] allow
_UNCONFIRMED_DRIFT = (DRIFT_BYTECODE_UNVERIFIED, DRIFT_RECORD_UNREADABLE)
ALLOWABLE_DRIFT = tuple(d for d in DRIFT_IDS if d not in _UNCONFIRMED_DRIFT)


@dataclass(frozen=True)
class FindingKind:
    severity: Severity  # once enough evidence is in (see ``pending_before``)
    pending_before: str  # "" or what must happen first; until then the finding is PENDING
    meaning: str


# Every id the engine can produce; docs/policy.md carries the same table (a test checks it).
FINDINGS: dict[str, FindingKind] = {
    EVIDENCE_STALE: FindingKind(
        Severity.PENDING, "", "the target's latest report is older than freshness_s (STALE)"
    ),
    EVIDENCE_NO_REPORT: FindingKind(
        Severity.PENDING, "", "fewer selected targets reported than the run needs (run level)"
    ),
    EVIDENCE_NO_PROCESSES: FindingKind(Severity.PENDING, "", "the target reported no processes"),
    EVIDENCE_UNOBSERVABLE: FindingKind(
        Severity.PENDING,
        "",
        "the agent could not see or read what it should (no vLLM process in its PID namespace, "
        "/proc refused)",
    ),
    EVIDENCE_UNAUTHENTICATED: FindingKind(
        Severity.PENDING,
        "",
        "nobody vouches for who sent the evidence (a verifier in --insecure mode on a network "
        "address, or evidence stored before a restart and not yet renewed)",
    ),
    EVIDENCE_CONTAINER_MISMATCH: FindingKind(
        Severity.ERROR,
        "",
        "a process of a target bound in [targets.containers] runs in another container (or none)",
    ),
    EVIDENCE_CONTAINER_UNKNOWN: FindingKind(
        Severity.PENDING,
        "",
        "a binding by container name or label cannot be checked: the agent has no Docker API",
    ),
    EVIDENCE_PROBE_ABSENT: FindingKind(
        Severity.ERROR, "", "a process whose role is in require_probe has no probe"
    ),
    EVIDENCE_PROBE_ERRORS: FindingKind(
        Severity.WARNING, "", "the probe in a process recorded errors of its own"
    ),
    EVIDENCE_UNPROBED: FindingKind(
        Severity.PENDING,
        "",
        "a rule needs a process whose role is not in require_probe and that has no probe",
    ),
    EVIDENCE_MANIFEST_UNRESOLVED: FindingKind(
        Severity.PENDING, "", "a process's file list was not resolved (digest only)"
    ),
    EVIDENCE_ROLE_MISSING: FindingKind(
        Severity.PENDING, "", "a rule needs a role and no process of that role reported"
    ),
    NATIVE_REPLACED: FindingKind(
        Severity.ERROR, "", "a mapped native library's path now holds other bytes than mapped"
    ),
    NATIVE_DELETED: FindingKind(
        Severity.ERROR, "", "a mapped native library was deleted from disk while mapped"
    ),
    NATIVE_UNREADABLE: FindingKind(
        Severity.WARNING, "", "a native mapping could not be read, so its bytes are unknown"
    ),
    EVIDENCE_DISAGREEMENT: FindingKind(
        Severity.ERROR,
        "",
        "the probe (in-process) and the agent (through /proc) saw different bytes for one file",
    ),
    STEPS_INSUFFICIENT: FindingKind(
        Severity.PENDING, "", "a judged process has run fewer productive steps than min_steps"
    ),
    STEPS_RAISED: FindingKind(
        Severity.WARNING,
        "",
        "execute_model raised in a process (a driver misusing the step protocol): not counted",
    ),
    HOOK_NOT_DECLARED: FindingKind(
        Severity.ERROR, "min_steps", "the probe in the process was not told about the hook"
    ),
    HOOK_NOT_LOADED: FindingKind(
        Severity.ERROR, "min_steps", "the hook's module was never imported in the process"
    ),
    HOOK_UNRESOLVED: FindingKind(
        Severity.ERROR, "min_steps", "the hook's module was imported but its target is missing"
    ),
    HOOK_NOT_INSTANTIATED: FindingKind(
        Severity.ERROR, "min_steps", "the hook's class never had an instance and never fired"
    ),
    HOOK_NOT_FIRING: FindingKind(
        Severity.ERROR, "", "the hook is loaded but fired 0 times while min_steps steps ran"
    ),
    HOOK_FIRE_RATIO_LOW: FindingKind(
        Severity.ERROR,
        "",
        "fired_productive / productive steps is below min_fires_per_productive_step",
    ),
    HOOK_OUTSIDE_STEPS_ONLY: FindingKind(
        Severity.ERROR,
        "",
        "the hook fired, but only outside engine steps (start-up, warm-up), never on its steps",
    ),
    HOOK_NO_DEVICE_COUNTER: FindingKind(
        Severity.ERROR,
        "",
        'count = "device": the hook has no device-side counter (declare it @device)',
    ),
    HOOK_FIRING: FindingKind(
        Severity.INFO, "", "the hook fired often enough (its counts, for the record)"
    ),
    RUNNER_UNKNOWN: FindingKind(
        Severity.PENDING, "", "no live runner is recorded in a process that runs steps"
    ),
    RUNNER_UNEXPECTED: FindingKind(
        Severity.ERROR, "min_steps", "the live runner's class is not expect_class"
    ),
    RUNNER_UNWITNESSED: FindingKind(
        Severity.ERROR,
        "200 stack samples",
        "no out-of-process stack sample caught a thread in the live runner's step file",
    ),
    RUNNER_WITNESSED: FindingKind(
        Severity.INFO, "", "stack samples caught the runner's step file executing (the record)"
    ),
    FILE_NOT_LOADED: FindingKind(
        Severity.ERROR, "min_steps (any process)", "no loaded file matches a [[files]] entry"
    ),
    FILE_HASH_MISMATCH: FindingKind(
        Severity.ERROR, "", "a matching loaded file's sha256 is not the expected one"
    ),
    FILE_UNVERIFIABLE: FindingKind(
        Severity.PENDING, "", "matching files exist but none of a kind whose hash can be compared"
    ),
    FILE_FORBIDDEN: FindingKind(Severity.ERROR, "", "a loaded file matches a [[forbid]] entry"),
    DRIFT_MODIFIED_AFTER_LOAD: FindingKind(
        Severity.ERROR, "", "a loaded file's bytes on disk changed after the process started"
    ),
    DRIFT_BYTECODE_STALE: FindingKind(
        Severity.ERROR, "", "bytecode the interpreter used was compiled from other source"
    ),
    DRIFT_BYTECODE_UNVERIFIED: FindingKind(
        Severity.WARNING, "", "bytecode that may be stale could not be compared with its source"
    ),
    DRIFT_BYTECODE_UNCHECKED: FindingKind(
        Severity.ERROR, "", "an unchecked-hash pyc was used (never compared with its source)"
    ),
    DRIFT_BYTECODE_SOURCELESS: FindingKind(
        Severity.ERROR, "", "a module ran from a .pyc with no source beside it"
    ),
    DRIFT_MODULE_SHADOWED: FindingKind(
        Severity.ERROR, "", "a module was loaded from elsewhere than where its distribution put it"
    ),
    DRIFT_MODULE_FILELESS: FindingKind(
        Severity.ERROR, "", "a module claims to come from a file that does not exist"
    ),
    DRIFT_RECORD_UNREADABLE: FindingKind(
        Severity.WARNING, "", "an installer's RECORD, METADATA or direct_url.json is unreadable"
    ),
    PROVENANCE_ORIGINS: FindingKind(
        Severity.INFO, "", "a process's files per provenance class, and each non-pristine file"
    ),
    PROVENANCE_UNJUDGED: FindingKind(
        Severity.PENDING, "", "the agent has not judged the provenance of a process's files"
    ),
    PROVENANCE_NOT_PRISTINE: FindingKind(
        Severity.ERROR, "", "a file of a pristine-required distribution is not pristine"
    ),
    PROVENANCE_NOT_LOADED: FindingKind(
        Severity.ERROR, "min_steps", "no process loaded a file of a pristine-required distribution"
    ),
    PATCH_DECLARED: FindingKind(
        Severity.INFO, "", "a patched file matches its [[patches]] entry (for the record)"
    ),
    PATCH_UNDECLARED: FindingKind(
        Severity.ERROR, "", "a file of a pristine-required distribution differs from RECORD"
    ),
    PATCH_NOT_APPLIED: FindingKind(
        Severity.ERROR, "", "a [[patches]] file was loaded with its published bytes"
    ),
}


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


@dataclass(frozen=True)
class TargetSnapshot:
    """The latest evidence for one target."""

    target: str  # target name as the agent reports it
    processes: tuple[ProcessReport, ...]  # ``files`` already resolved (never None here)
    received_unix: float  # when the verifier received the report
    container_ids: tuple[str, ...] = ()  # distinct ProcessReport.container_id values
    collect_s: float = 0.0  # how old the evidence was when the agent sent it (its own clock)
    containers: tuple[ContainerInfo, ...] = ()  # what the agent found about those containers
    unobservable: tuple[str, ...] = ()  # what the agent could not see (TargetReport.unobservable)
    # How the report was authenticated ("agent NAME" over mTLS or a token, "local": insecure
    # mode on a Unix socket or loopback); None: nobody vouches for who sent it.
    authenticated_as: str | None = "local"

    @property
    def evidence_unix(self) -> float:
        """When the agent read the evidence, on the verifier's clock: receipt minus the agent's
        collection time. Freshness and window seals date evidence by this, not by receipt: a
        report that spent seconds hashing files carries counters from its start."""
        return self.received_unix - self.collect_s


@dataclass(frozen=True)
class TargetSelection:
    """``[targets]``: which reporting targets a run covers."""

    names: tuple[str, ...] = ()  # empty: every target that reports
    container_ids: tuple[str, ...] = ()  # prefixes (>= 12 characters); empty: any container
    min_targets: int = DEFAULT_MIN_TARGETS
    # [targets.containers]: target name -> the container its evidence must come from: a
    # container name, an id prefix (>= 12 hex digits) or "label:KEY=VALUE"
    containers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class EvidenceSettings:
    """``[evidence]``: how fresh and how much evidence a verdict needs."""

    freshness_s: float = DEFAULT_FRESHNESS_S
    min_steps: int = DEFAULT_MIN_STEPS
    require_probe: tuple[str, ...] = DEFAULT_REQUIRE_PROBE
    # Accept evidence nobody vouches for (a demo on an --insecure network address). Named
    # unsafe: a PASS then says nothing about who sent the evidence.
    unsafe_allow_unauthenticated: bool = False


@dataclass(frozen=True)
class ProvenanceSettings:
    """``[provenance]``: drift ids downgraded to warnings."""

    allow: tuple[str, ...] = ()


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
