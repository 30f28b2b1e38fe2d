"""The finding catalogue: every finding id the policy engine can produce, and what each means.

Ids are stable: tools and people match on them. ``FINDINGS`` says, per id, its severity once
enough evidence is in, what must happen first (until then it is PENDING) and what it means;
docs/policy.md carries the same table (a test checks it). The rules (``rules*.py``) produce
these findings through the rule interface (``interface.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from servewitness.model import (
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_CHANGED_AFTER_START,
    DRIFT_CHANGED_IN_CACHE,
    DRIFT_CODE_PATCHED,
    DRIFT_CODE_UNVERIFIED,
    DRIFT_IDS,
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_MODULE_FILELESS,
    DRIFT_MODULE_SHADOWED,
    DRIFT_MODULE_UNFILED,
    DRIFT_PTH_UNCLAIMED,
    DRIFT_RECORD_CHANGED_AFTER_START,
    DRIFT_RECORD_UNREADABLE,
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    EVIDENCE_STDLIB_UNCONFIRMED,
    Severity,
)
from servewitness.policy.window import (
    WINDOW_CLOCK_STEPPED,
    WINDOW_EVIDENCE_UNLEDGERED,
    WINDOW_HOOK_LAGGED,
    WINDOW_NO_FRESH_EVIDENCE,
    WINDOW_NO_STEPS,
    WINDOW_NOT_PASS,
    WINDOW_PROCESS_CHANGED,
    WINDOW_REQUESTS_UNSERVED,
    WINDOW_SEALED_BEFORE_OPEN,
)

# Finding ids. Stable: tools and people match on them.
EVIDENCE_STALE = "evidence.stale"
POLICY_REFUSED = "policy.refused"
EVIDENCE_NO_REPORT = "evidence.no_report"
EVIDENCE_TARGET_EXPIRED = "evidence.target_expired"
EVIDENCE_NO_PROCESSES = "evidence.no_processes"
VERDICT_FINDINGS_OMITTED = "verdict.findings_omitted"
EVIDENCE_PROBE_ABSENT = "evidence.probe_absent"
EVIDENCE_PROBE_ERRORS = "evidence.probe_errors"
EVIDENCE_PROBE_ERRORS_JUDGED = "evidence.probe_errors.judged"
EVIDENCE_UNPROBED = "evidence.unprobed"
EVIDENCE_MANIFEST_UNRESOLVED = "evidence.manifest_unresolved"
EVIDENCE_ROLE_MISSING = "evidence.role_missing"
EVIDENCE_DISAGREEMENT = "evidence.disagreement"
EVIDENCE_CONTAINER_MISMATCH = "evidence.container_mismatch"
EVIDENCE_CONTAINER_UNKNOWN = "evidence.container_unknown"
EVIDENCE_UNOBSERVABLE = "evidence.unobservable"
EVIDENCE_UNAUTHENTICATED = "evidence.unauthenticated"
EVIDENCE_CLOCK_SKEW = "evidence.clock_skew"
EVIDENCE_TARGET_MIXED = "evidence.target.mixed"
EVIDENCE_AUTHENTICATED = "evidence.authenticated"
POLICY_UNSAFE = "policy.unsafe"
NATIVE_REPLACED = "provenance.native.replaced"
NATIVE_DELETED = "provenance.native.deleted"
NATIVE_UNREADABLE = "provenance.native.unreadable"
NATIVE_CHANGED_IN_PLACE = "provenance.native.changed_in_place"
NATIVE_FROM_MEMORY = "provenance.native.from_memory"
STEPS_INSUFFICIENT = "liveness.steps.insufficient"
STEPS_RAISED = "liveness.steps.raised"
HOOK_NOT_DECLARED = "liveness.hook.not_declared"
HOOK_NOT_LOADED = "liveness.hook.not_loaded"
HOOK_UNRESOLVED = "liveness.hook.unresolved"
HOOK_NOT_INSTANTIATED = "liveness.hook.not_instantiated"
HOOK_NOT_FIRING = "liveness.hook.not_firing"
HOOK_FIRE_RATIO_LOW = "liveness.hook.fire_ratio_low"
HOOK_OUTSIDE_STEPS_ONLY = "liveness.hook.outside_steps_only"
HOOK_NO_DEVICE_COUNTER = "liveness.hook.no_device_counter"
HOOK_FIRING = "liveness.hook.firing"
HOOK_TARGET_MISMATCH = "liveness.hook.target_mismatch"
RUNNER_UNKNOWN = "liveness.runner.unknown"
RUNNER_UNEXPECTED = "liveness.runner.unexpected"
RUNNER_UNWITNESSED = "liveness.runner.unwitnessed"
RUNNER_WITNESSED = "liveness.runner.witnessed"
FILE_NOT_LOADED = "provenance.file.not_loaded"
FILE_HASH_MISMATCH = "provenance.file.hash_mismatch"
FILE_UNVERIFIABLE = "provenance.file.unverifiable"
FILE_FORBIDDEN = "provenance.file.forbidden"
FILE_HASHED_AFTER = "provenance.file.hashed_after"
PROVENANCE_UNJUDGED = "provenance.unjudged"
PROVENANCE_ORIGINS = "provenance.origins"
PROVENANCE_NOT_PRISTINE = "provenance.not_pristine"
PROVENANCE_NOT_LOADED = "provenance.distribution.not_loaded"
PATCH_DECLARED = "provenance.patch.declared"
PATCH_UNDECLARED = "provenance.patch.undeclared"
PATCH_NOT_APPLIED = "provenance.patch.not_applied"
CODE_UNCLAIMED = "provenance.code.unclaimed"
CODE_CLAIMED = "provenance.code.claimed"
DRIFT_VOUCHED = "provenance.drift.vouched"
DISTRIBUTION_MISMATCH = "provenance.distribution.mismatch"
DISTRIBUTION_UNLISTED = "provenance.distribution.unlisted"
# Always WARNING, so never in [provenance] allow
_UNCONFIRMED_DRIFT = (
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_RECORD_UNREADABLE,
    DRIFT_CODE_UNVERIFIED,
    DRIFT_MODULE_CUSTOM_LOADER,
)
# Always INFO (a change the agent waived, said for the record), so never in [provenance] allow
INFORMATIONAL_DRIFT = (DRIFT_CHANGED_IN_CACHE,)
ALLOWABLE_DRIFT = tuple(
    d for d in DRIFT_IDS if d not in _UNCONFIRMED_DRIFT and d not in INFORMATIONAL_DRIFT
)


@dataclass(frozen=True)
class FindingKind:
    severity: Severity  # once enough evidence is in (see ``pending_before``)
    pending_before: str  # "" or what must happen first; until then the finding is PENDING
    meaning: str


# Every id the engine can produce; docs/policy.md carries the same table (a test checks it).
FINDINGS: dict[str, FindingKind] = {
    POLICY_REFUSED: FindingKind(
        Severity.ERROR,
        "",
        "the run's stored policy does not load under this verifier's rules (a weak policy "
        "stored before they refused it names the unsafe key that would accept it): FAIL "
        "until the run is registered again (run level)",
    ),
    EVIDENCE_STALE: FindingKind(
        Severity.PENDING, "", "the target's latest report is older than freshness_s (STALE)"
    ),
    EVIDENCE_NO_REPORT: FindingKind(
        Severity.PENDING, "", "fewer selected targets reported than the run needs (run level)"
    ),
    EVIDENCE_TARGET_EXPIRED: FindingKind(
        Severity.WARNING,
        "",
        "a target the run selects was silent past the verifier's --target-expiry: it has left "
        "the run's verdict (min_targets counts without it) until it reports again (run level)",
    ),
    EVIDENCE_NO_PROCESSES: FindingKind(Severity.PENDING, "", "the target reported no processes"),
    VERDICT_FINDINGS_OMITTED: FindingKind(
        Severity.INFO, "", "more findings than a verdict lists; counted by id"
    ),
    EVIDENCE_UNOBSERVABLE: FindingKind(
        Severity.PENDING,
        "",
        "the agent could not see or read what it should (no vLLM process in its PID namespace, "
        "/proc refused)",
    ),
    EVIDENCE_UNAUTHENTICATED: FindingKind(
        Severity.PENDING,
        "",
        "nobody vouches for who sent the evidence (plaintext TCP, loopback included; or evidence "
        "stored before a restart and not yet renewed)",
    ),
    EVIDENCE_AUTHENTICATED: FindingKind(
        Severity.INFO,
        "",
        "who sent the evidence, as the verifier authenticated it: an mTLS or token identity, or "
        "the kernel's credentials of a listed uid on the Unix socket (the record)",
    ),
    POLICY_UNSAFE: FindingKind(
        Severity.WARNING,
        "",
        "run level: the policy sets an unsafe_* flag; says whether the verdict holds only "
        "because of it (the run judged again with the flag at its safe default)",
    ),
    EVIDENCE_CLOCK_SKEW: FindingKind(
        Severity.PENDING,
        "",
        "the report's own time (the agent's clock) is further from the verifier's receipt time "
        "than clock_skew_s, ahead or behind: never fresh",
    ),
    EVIDENCE_TARGET_MIXED: FindingKind(
        Severity.ERROR,
        "",
        "the agent (no --pid) saw independent vLLM process trees under one target: two servers "
        "merged, so the evidence may be another server's",
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
        Severity.WARNING,
        "",
        "the probe in a process recorded errors of its own outside what the policy judges",
    ),
    EVIDENCE_PROBE_ERRORS_JUDGED: FindingKind(
        Severity.ERROR,
        "",
        "the probe in a process recorded errors of its own in evidence the policy judges "
        "(steps, speculation, request bindings, a declared hook, loaded files): that evidence "
        "may be incomplete, and a missing count reads like a true zero",
    ),
    EVIDENCE_PROBE_UNBOUND: FindingKind(
        Severity.ERROR,
        "",
        "probe state found under a process's name is not its own (the process does not hold "
        "its files): planted or stale evidence, refused",
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
    NATIVE_FROM_MEMORY: FindingKind(
        Severity.ERROR,
        "",
        "a shared object was loaded from memory (a memfd): no file on any disk holds its bytes",
    ),
    NATIVE_CHANGED_IN_PLACE: FindingKind(
        Severity.ERROR,
        "",
        "a mapped native library was rewritten in place (same inode) while mapped",
    ),
    EVIDENCE_DISAGREEMENT: FindingKind(
        Severity.ERROR,
        "",
        "the probe (in-process) and the agent (through /proc) saw different bytes for one file",
    ),
    EVIDENCE_JOURNAL_EDITED: FindingKind(
        Severity.ERROR,
        "",
        "a probe's journal is not the one it wrote: a record deleted, inserted, reordered, cut "
        "off, or changed after the agent read it",
    ),
    EVIDENCE_STDLIB_UNCONFIRMED: FindingKind(
        Severity.ERROR,
        "",
        "the standard library directory a probe names is not that of the interpreter the "
        "process runs (/proc/<pid>/exe), or that one could not be found",
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
    HOOK_TARGET_MISMATCH: FindingKind(
        Severity.ERROR, "", "the hook of that name wraps another target than the policy pins"
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
    FILE_HASHED_AFTER: FindingKind(
        Severity.INFO, "", "the files of a process whose only hash was taken after the fact"
    ),
    DRIFT_MODIFIED_AFTER_LOAD: FindingKind(
        Severity.ERROR, "", "a loaded file's bytes on disk changed after the process started"
    ),
    DRIFT_CHANGED_AFTER_START: FindingKind(
        Severity.ERROR,
        "",
        "a file hashed after the fact changed after the process started: what ran may differ",
    ),
    DRIFT_CHANGED_IN_CACHE: FindingKind(
        Severity.INFO,
        "",
        "a file hashed after the fact changed after the process started, under its compile "
        "caches or temporary directories and claimed by no RECORD (not judged; a pin on it "
        "cannot be checked)",
    ),
    DRIFT_BYTECODE_STALE: FindingKind(
        Severity.ERROR, "", "bytecode the interpreter used is not what its source compiles to"
    ),
    DRIFT_BYTECODE_UNVERIFIED: FindingKind(
        Severity.WARNING, "", "bytecode the interpreter used could not be compared with its source"
    ),
    DRIFT_BYTECODE_UNCHECKED: FindingKind(
        Severity.ERROR, "", "an unchecked-hash pyc was used and not shown to be its source's"
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
    DRIFT_RECORD_CHANGED_AFTER_START: FindingKind(
        Severity.ERROR,
        "",
        "an installer's RECORD, METADATA or direct_url.json the loaded files were judged "
        "against changed after the process started",
    ),
    DRIFT_CODE_PATCHED: FindingKind(
        Severity.ERROR,
        "",
        "the code that runs a step method or hook target is not its file's own definition",
    ),
    DRIFT_CODE_UNVERIFIED: FindingKind(
        Severity.WARNING,
        "",
        "the code that runs a step method or hook target could not be verified against its file",
    ),
    DRIFT_MODULE_UNFILED: FindingKind(
        Severity.ERROR,
        "",
        "a module ran code no file holds (a custom loader not defined in a pristine file, source "
        "executed into a hand-made module, a main module read from standard input)",
    ),
    DRIFT_MODULE_CUSTOM_LOADER: FindingKind(
        Severity.WARNING,
        "",
        "a module was executed by a custom loader whose class a pristine file defines; its source "
        "hash is the probe's word only",
    ),
    DRIFT_PTH_UNCLAIMED: FindingKind(
        Severity.ERROR,
        "",
        "a .pth file of a site directory executes code and no RECORD lists it with these bytes",
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
    CODE_UNCLAIMED: FindingKind(
        Severity.ERROR, "", "a judged process ran code nobody claims (all_code_claimed)"
    ),
    CODE_CLAIMED: FindingKind(
        Severity.INFO, "", "code accepted beyond pristine and stdlib files (all_code_claimed)"
    ),
    DISTRIBUTION_UNLISTED: FindingKind(
        Severity.ERROR, "", "a judged process loaded a distribution only_distributions omits"
    ),
    DISTRIBUTION_MISMATCH: FindingKind(
        Severity.ERROR, "", "a pinned distribution has another version or content"
    ),
    DRIFT_VOUCHED: FindingKind(
        Severity.INFO, "", "drift accounted for by bytes [[claims]] or [[patches]] vouch for"
    ),
    # Produced when the verifier seals a measurement window (policy/window.py, judged over the
    # window from its stored reports); each makes the window not hold (held false, signed).
    WINDOW_NOT_PASS: FindingKind(
        Severity.ERROR, "", "the run does not PASS at the window's seal (the verdict's top finding)"
    ),
    WINDOW_NO_STEPS: FindingKind(
        Severity.ERROR,
        "",
        "no productive step ran during the window in a process that runs steps (or none of the "
        "kind a hook is judged on): an idle window proves nothing",
    ),
    WINDOW_HOOK_LAGGED: FindingKind(
        Severity.ERROR,
        "",
        "a hook fired fewer than its minimum per judged step during the window (fires and steps "
        "at the seal minus those at the open, in that process)",
    ),
    WINDOW_PROCESS_CHANGED: FindingKind(
        Severity.ERROR,
        "",
        "a process at the window's seal was not there at its open, or one at the open is gone "
        "(another boot id, pid or start time is another process)",
    ),
    WINDOW_NO_FRESH_EVIDENCE: FindingKind(
        Severity.ERROR,
        "",
        "some target did not report after the seal began, within its timeout: nothing shows "
        "the processes at the window's end",
    ),
    WINDOW_REQUESTS_UNSERVED: FindingKind(
        Severity.ERROR,
        "",
        "a request the harness sent during the window is bound to no step of the window's "
        "processes after its open (seal --requests)",
    ),
    WINDOW_SEALED_BEFORE_OPEN: FindingKind(
        Severity.ERROR,
        "",
        "the seal is dated before the window's open: the verifier's wall clock was stepped back",
    ),
    WINDOW_CLOCK_STEPPED: FindingKind(
        Severity.ERROR,
        "",
        "the window's length by the verifier's wall clock is not its length on its boot clock "
        "(same boot): the wall clock was stepped during the window",
    ),
    WINDOW_EVIDENCE_UNLEDGERED: FindingKind(
        Severity.ERROR,
        "",
        "a report the window's evidence rests on has no ledger entry: a row written into the "
        "database behind the ledger's back, not known to be an agent's",
    ),
}
