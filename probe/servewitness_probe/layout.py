"""The on-disk contract between the probe (writer) and its readers (``servewitness.evidence``,
and the agent that runs them): slot numbers, file names, environment variable names. It is
public on purpose: the probe and every reader import it, so the format has one definition.

Each probed process owns one directory, ``<probe dir>/<boot>-<pid ns>-<pid>-<start ticks>/``
(``process_dir_name``), holding:

* ``counters``: a fixed-size file mapped into memory by the probe (shared memory when the
  probe dir is on ``/dev/shm``, the default). Native-endian unsigned 64-bit slots. A reader
  maps or reads it at any time without the probe's cooperation.
* ``journal.jsonl``: an append-only log of JSON records (one per line): process start,
  every file the import system read with its hash (``k: "file"``; besides source, bytecode,
  extension and data, the code from no plain file: ``kind`` ``pth``, ``archive``, ``member``
  (a zip member, path ``<archive>/<member>``, ``archive`` naming it) and ``inline`` (``-c``
  code, path ``-c``)), modules that ran code no file holds (``k: "unfiled"``, see
  ``_loaders``), hook declarations and state changes, role, live runner, probe errors. A
  reader tolerates a partial last line. Every record carries ``seq``, its index in the
  journal (0 for ``start``), and ``S_JOURNAL_RECORDS`` counts the records written, so a
  line deleted, reordered, inserted or cut off is seen (layout 3; a reader of layout 3 takes
  a journal without them as edited).
* ``bindings.jsonl``: an append-only log of request bindings (one JSON object per line,
  written in batches; a reader tolerates a partial last line; records are in close order, and
  two batches may land out of order). Written by ``_bindings``; read by
  ``servewitness.evidence.bindings_reader``. Two kinds:

  - in the process that runs engine steps, one per request, when it finished (or, at process
    exit, when still open)::

        {"k":"req","id":INTERNAL,"s0":int,"s1":int,"n":int,"tok":int,"t0":ns,"t1":ns,
         "f0":int,"f1":int,"hooks":{"name":fires,...},"end":"finished"|"open"
         [,"spec":{"drafts":int,"draft_tokens":int,"accepted":int,"emitted":int,
                   "pos":[int,...]}]}

    ``id``: the engine's internal request id; ``s0``/``s1``: the process's ``steps_total``
    at the first and the last step that scheduled it; ``n``: steps that scheduled it;
    ``tok``: tokens scheduled for it over those steps; ``t0``/``t1``: unix ns of the first
    and last of them; ``f0``/``f1``: file records in ``journal.jsonl`` when they ran (the
    first F file records of the journal are the manifest in force: ``S_FILES_RECORDED``);
    ``hooks``: per declared hook, fires in this process from the request's first step to
    its close (all fires of the process in that window, shared with whatever else ran in
    it; a hook declared later counts from zero); ``end``: ``finished`` (the id came back in
    ``finished_req_ids``: completed, stopped or aborted) or ``open`` (the process exited
    first); ``spec`` (only while speculation is on): the request's share of the process's
    ``S_SPEC_*`` counts, counted the same way (``drafts``: its steps that verified drafts;
    ``pos``: accepted drafts per position, trailing zeros left out; ``emitted``: tokens
    sampled for it).
  - in the API server, one per engine request it submits::

        {"k":"ext","id":INTERNAL,"ext":EXTERNAL,"t":ns[,"xrid":X_REQUEST_ID]}

    ``ext``: vLLM's external request id (``cmpl-<X-Request-Id>-<prompt index>`` for
    completions, ``chatcmpl-<X-Request-Id>`` for chat; a generated id replaces the header
    when there is none); ``id``: the internal id the engine and the worker see
    (``<ext>-<8 random chars>``, or ``<child index>_<ext>-<8 random chars>`` for each child
    of an ``n > 1`` request); ``xrid``: the client's raw ``X-Request-Id`` header, when the
    request came through an OpenAI serving class that read it.

Among the journal's records, ``{"k":"code"}`` says which code object runs one step method
or declared hook target (``_code``): ``subject`` (``runner.execute_model``,
``worker.sample_tokens``, ``hook:NAME``), ``via`` (``class``: the attribute as its class
resolves it; ``instance``: an attribute set on the live object itself, which shadows the
class's), the ``owner`` whose definition it should be (``owner_module``, ``owner_qualname``,
``owner_file``; ``owner_qualname`` is empty for a module-level function), ``attr``,
``probe_layers`` (the probe's own wrappers, left out), ``python`` (``major.minor``),
``optimize`` (``sys.flags.optimize``), ``absent`` (the instance attribute is gone again) and
``layers``, outermost first: ``kind`` (``function``, ``method``, ``staticmethod``,
``classmethod``, ``partial``, ``object``, ``builtin``, ``other``), ``via`` (how it was
reached from the layer above: ``attribute``, ``__wrapped__``, ``__func__``, ``func``, or
``probe``: what one of the probe's own wrappers calls),
``held`` (whether the layer above holds it where it calls it from: its closure, its
``__func__`` or ``func``; None for the first), ``module``, ``qualname`` (the object's
``__module__`` and ``__qualname__``) and, for one with Python code (a function, or an
object's ``__call__``), ``code_qualname``, ``name``, ``file``, ``line`` (``co_qualname``,
``co_name``, ``co_filename``, ``co_firstlineno``), ``sha256`` (``code_digest``) and
``globals_file`` (``__file__`` of the namespace it runs in); ``cut`` marks a chain cut after 16
layers. A new record is written when what runs changes.

The name says whose state it is: ``<boot>`` is the first 8 hex digits of the kernel's boot id
(``/proc/sys/kernel/random/boot_id``), ``<pid ns>`` the inode of the process's PID namespace
(``/proc/self/ns/pid``), ``<pid>`` its pid in that namespace, ``<start ticks>`` its start time
(clock ticks since boot, field 22 of ``/proc/<pid>/stat``), which tells pid reuse apart. Two
containers that share ``/dev/shm`` can each have a pid 1 started in the same tick: the PID
namespace keeps their directories apart, and the boot id keeps a directory left from an
earlier boot (a probe dir on disk) from passing for a live process's. Older probes named the
directory ``<pid>-<start ticks>`` (``legacy_dir_name``): readers may still look there.

A name is a claim, not a proof. The probe creates its directory and files itself (a directory
already there under its name is removed first, never written into) and holds them for its
whole life: ``counters`` mapped (MAP_SHARED), ``journal.jsonl`` and ``bindings.jsonl`` open. A
reader accepts a directory as a process's state only when the kernel shows that process
holding those very files (``servewitness.evidence.binding``); anyone may create a directory with
any name. The journal says which descriptors hold them (``fd`` in the ``start`` record, a
``bindings_fd`` record when ``bindings.jsonl`` is opened): a hint that spares a reader looking
at every descriptor, checked like everything else.

Garbage collection (``probe._core``) removes only directories whose name says they are of
this boot and this process's PID namespace and whose process is gone, or of another boot;
never another namespace's, never a legacy name (it carries no namespace).

Stdlib only, no side effects at import: both the probe and the readers import this module.
"""

from __future__ import annotations

import hashlib
from types import CodeType
from typing import Any, NamedTuple

ENV_PROBE_DIR = "VERIFIER_PROBE_DIR"
ENV_HOOKS = "VERIFIER_HOOKS"
ENV_PROBE_DISABLE = "VERIFIER_PROBE_DISABLE"
ENV_EARLY = "VERIFIER_PROBE_EARLY"
ENV_BINDINGS = "VERIFIER_PROBE_BINDINGS"  # "0": record no request bindings
DEFAULT_PROBE_DIR = "/dev/shm/verifier-probe"  # noqa: S108 - shared memory is the point

COUNTERS_FILE = "counters"
JOURNAL_FILE = "journal.jsonl"
BINDINGS_FILE = "bindings.jsonl"

MAGIC = 0x5646595052424531  # "VFYPRBE1"
LAYOUT_VERSION = 3  # 3: journal records numbered (seq), S_JOURNAL_RECORDS
SLOT_BYTES = 8
N_SLOTS = 4096

# Header slots.
H_MAGIC = 0
H_VERSION = 1
H_PID = 2
H_NSLOTS = 3
H_HOOKS_USED = 4

# Step slots (in the process that runs the model; zero elsewhere).
S_STEPS_TOTAL = 8
S_STEPS_PRODUCTIVE = 9
S_STEPS_EMPTY = 10
S_TOKENS_SCHEDULED = 11
S_REQUESTS_SCHEDULED = 12
S_REQUESTS_MAX = 13
S_LAST_STEP_UNIX_NS = 14
S_FIRST_STEP_UNIX_NS = 15
S_PROBE_ERRORS = 16
S_CURRENT_PRODUCTIVE = 17  # unused since layout 2 (PHASE_PRODUCTIVE in S_CURRENT_PHASE)
S_STEPS_PREFILL = 18  # productive steps that scheduled prefill tokens (a mixed step counts in
S_STEPS_DECODE = 19  # both) / that scheduled decode tokens
S_TOKENS_PREFILL = 20
S_TOKENS_DECODE = 21
S_STEPS_DUMMY = 22  # execute_model calls for warm-up or padding (dummy_run): not steps
S_CURRENT_PHASE = 23  # bits of the latest step (until the next): PHASE_*
S_IN_STEP = 24  # 1 while the process is inside execute_model or sample_tokens
S_FILES_RECORDED = 25  # "file" records written to journal.jsonl so far (any process)
S_BIND_OPEN = 26  # requests open in the bindings table (see bindings.jsonl)
S_BIND_OVERFLOW = 27  # new requests not tracked because MAX_OPEN were open (one per step)
S_BIND_WRITTEN = 28  # records written to bindings.jsonl
# Speculative decoding (the process that runs the model, while the live config has a
# speculative_config; zero otherwise). Counted from the same data vLLM's scheduler fills its
# SpecDecodingStats from: each step's scheduled_spec_decode_tokens and the runner output's
# sampled_token_ids per request (accepted = sampled - 1, as vLLM counts them).
S_SPEC_STEPS = 29  # steps that verified drafts for at least one request
S_SPEC_DRAFTS = 30  # (request, step) pairs that verified drafts: vLLM's num_drafts
S_SPEC_DRAFT_TOKENS = 31  # draft tokens verified (less grammar-invalidated ones)
S_SPEC_ACCEPTED = 32  # draft tokens accepted
S_SPEC_EMITTED = 33  # tokens the runner output sampled, every request, every step
S_SPEC_UNREAD = 34  # steps with drafts whose runner output carried no sampled tokens to read
S_STEPS_RAISED = 35  # execute_model calls that raised: taken back, not counted as steps
S_JOURNAL_RECORDS = 36  # records written to journal.jsonl (the next record's seq)
S_SWEEPS_BEGUN = 37  # the sweeper's passes begun / ended in this process: a pass that
S_SWEEPS_ENDED = 38  # began after a moment is whole once ENDED passes BEGUN read then
S_SPEC_POS_BASE = 40  # accepted drafts at position i: S_SPEC_POS_BASE + i, i < SPEC_POSITIONS
SPEC_POSITIONS = 8  # positions counted (a deeper draft's later positions are not)
PHASE_PREFILL = 1
PHASE_DECODE = 2
PHASE_PRODUCTIVE = 4  # the latest step scheduled tokens

# Hook slots: HOOK_BASE + HOOK_STRIDE * index.
HOOK_BASE = 64
HOOK_STRIDE = 8
HK_FIRES = 0
HK_FIRST_STEP = 1  # the process's steps_total at the first fire (meaningful when fires > 0)
HK_LAST_STEP = 2  # the process's steps_total at the latest fire
HK_FIRES_PRODUCTIVE = 3  # fires while the latest step was productive (its sample phase included)
HK_FIRES_PREFILL = 4  # fires inside a step (execute_model or sample_tokens) that prefilled
HK_FIRES_DECODE = 5  # fires inside a step that decoded
HK_FIRES_OUTSIDE = 6  # fires outside any step: start-up, warm-up, capture, other threads
HK_DEVICE = 7  # a device-side counter's value as last read outside a step (see _device)
MAX_HOOKS = (N_SLOTS - HOOK_BASE) // HOOK_STRIDE


def hook_slot(index: int) -> int:
    """First slot of hook number INDEX."""
    return HOOK_BASE + HOOK_STRIDE * index


UNKNOWN_BOOT = "00000000"  # the boot part of a name when the boot id could not be read


def boot_prefix(boot_id: str) -> str:
    """The boot part of a state directory's name: the first 8 hex digits of BOOT_ID (a UUID as
    ``/proc/sys/kernel/random/boot_id`` gives it), lowercase; ``UNKNOWN_BOOT`` without them."""
    digits = "".join(c for c in boot_id.lower() if c in "0123456789abcdef")
    return digits[:8] if len(digits) >= 8 else UNKNOWN_BOOT


def ns_inode(link: str) -> int:
    """The inode of a namespace from its ``/proc/<pid>/ns/<kind>`` link text (``pid:[4026531836]``).
    Raises ValueError for any other text."""
    kind, bracket, rest = link.partition(":[")
    if (
        not kind
        or not bracket
        or not rest.endswith("]")
        or not (rest[:-1].isascii() and rest[:-1].isdigit())
    ):
        raise ValueError(f"not a namespace link: {link!r}")
    return int(rest[:-1])


def process_dir_name(boot_id: str, pid_ns: int, pid: int, start_ticks: int) -> str:
    """Directory name of one process's probe state: ``<boot>-<pid ns>-<pid>-<start ticks>``.
    PID_NS: the inode of its PID namespace (0: unknown); PID: its pid in that namespace."""
    return f"{boot_prefix(boot_id)}-{pid_ns}-{pid}-{start_ticks}"


def legacy_dir_name(pid: int, start_ticks: int) -> str:
    """The name older probes gave a process's state: ``<pid>-<start ticks>``. It carries no
    PID namespace: two processes in two namespaces can share it."""
    return f"{pid}-{start_ticks}"


class DirName(NamedTuple):
    """A state directory's name, parsed. ``boot`` and ``pid_ns`` are None for a legacy name."""

    boot: str | None
    pid_ns: int | None
    pid: int
    start_ticks: int


def parse_dir_name(name: str) -> DirName | None:
    """NAME as a state directory's name (either form); None when it is not one."""
    parts = name.split("-")
    if len(parts) == 2 and all(p.isdigit() and p.isascii() for p in parts):
        return DirName(None, None, int(parts[0]), int(parts[1]))
    if len(parts) != 4 or len(parts[0]) != 8 or not all(c in "0123456789abcdef" for c in parts[0]):
        return None
    if not all(p.isdigit() and p.isascii() for p in parts[1:]):
        return None
    return DirName(parts[0], int(parts[1]), int(parts[2]), int(parts[3]))


def stat_fields(stat: bytes) -> list[bytes]:
    """Fields 3.. of a ``/proc/<pid>/stat`` line (the command name may hold spaces and ')')."""
    return stat[stat.rindex(b")") + 2 :].split()


def start_ticks(stat: bytes) -> int:
    """Start time in clock ticks since boot (field 22) from a ``/proc/<pid>/stat`` line."""
    return int(stat_fields(stat)[19])


# The fields of a code object that ``code_digest`` covers, in order. ``co_filename`` is left
# out: a ``code`` record names the file beside the digest, and the agent compiles that file.
CODE_FIELDS = (
    "co_argcount",
    "co_posonlyargcount",
    "co_kwonlyargcount",
    "co_stacksize",
    "co_flags",
    "co_code",
    "co_names",
    "co_varnames",
    "co_freevars",
    "co_cellvars",
    "co_name",
    "co_qualname",
    "co_firstlineno",
    "co_linetable",
    "co_exceptiontable",
    "co_consts",
)


def code_digest(code: CodeType) -> str:
    """sha256 (hex) of CODE's fields (``CODE_FIELDS``), nested code objects and constants
    included, in an encoding of its own: the same for the code the process runs and for the
    code an outside party gets by compiling the same source under the same Python and
    optimization level. (``marshal.dumps`` is not: it writes references for objects that are
    shared in memory, which differ between the two.) ``co_code`` is the bytecode as
    compiled, whatever the interpreter specialized since."""
    h = hashlib.sha256()
    _feed(h, code, 0)
    return h.hexdigest()


def _feed(h: Any, v: object, depth: int) -> None:
    if depth > 200:  # deeper than any compiler nests: not from a source file
        h.update(b"!")
        return
    if isinstance(v, CodeType):
        h.update(b"C")
        for name in CODE_FIELDS:
            _feed(h, getattr(v, name, None), depth + 1)
    elif v is None:
        h.update(b"N")
    elif v is Ellipsis:
        h.update(b"E")
    elif isinstance(v, bool):
        h.update(b"T" if v else b"F")
    elif isinstance(v, (tuple, frozenset)):
        parts = []
        for x in v:
            sub = hashlib.sha256()
            _feed(sub, x, depth + 1)
            parts.append(sub.digest())
        if isinstance(v, frozenset):
            parts.sort()  # a set's order in memory is not its source's
        h.update((b"(" if isinstance(v, tuple) else b"{") + b"%d:" % len(parts) + b"".join(parts))
    else:
        tag, data = _scalar(v)
        h.update(tag + b"%d:" % len(data) + data)


def _scalar(v: object) -> tuple[bytes, bytes]:
    if isinstance(v, int):
        return b"I", str(v).encode()
    if isinstance(v, float):
        return b"D", v.hex().encode()
    if isinstance(v, complex):
        return b"J", f"{v.real.hex()},{v.imag.hex()}".encode()
    if isinstance(v, str):
        return b"S", v.encode("utf-8", "surrogatepass")
    if isinstance(v, bytes):
        return b"B", v
    return b"?", f"{type(v).__qualname__}:{v!r}".encode("utf-8", "backslashreplace")


# CPython's short options that take an argument (the rest of the word, or the next word), and
# its long options that do (3.11-3.13).
_ARG_OPTIONS = b"cmWX"
_ARG_LONG_OPTIONS = (b"--check-hash-based-pycs",)


def interpreter_main(argv: list[bytes]) -> tuple[str, bytes | None]:
    """How a Python interpreter started with ARGV (its full command line: ``sys.orig_argv``,
    or ``/proc/<pid>/cmdline`` split at NUL bytes, executable first) runs ``__main__``, as
    CPython parses its options: ``("command", CODE)`` for ``-c CODE``, ``("module", NAME)``
    for ``-m NAME``, ``("script", PATH)`` for a file, directory or zip, ``("stdin", None)``
    when none is given (standard input or the interactive prompt).

    The probe hashes the ``-c`` code from its own command line and the agent reads it again
    from ``/proc/<pid>/cmdline`` with this same function, so both parse it alike."""
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == b"--":
            return ("script", argv[i + 1]) if i + 1 < len(argv) else ("stdin", None)
        if word.startswith(b"--"):
            i += 2 if word in _ARG_LONG_OPTIONS else 1
            continue
        if not word.startswith(b"-") or word == b"-":
            return ("script", word) if word != b"-" else ("stdin", None)
        for j in range(1, len(word)):
            opt = word[j : j + 1]
            if opt not in _ARG_OPTIONS:
                continue
            rest = word[j + 1 :]
            if not rest:
                i += 1
                rest = argv[i] if i < len(argv) else b""
            if opt == b"c":
                return "command", rest
            if opt == b"m":
                return "module", rest
            break  # -W, -X: their argument ends the word
        i += 1
    return "stdin", None
