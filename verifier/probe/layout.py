"""The on-disk contract between the probe (writer) and its readers (``verifier.evidence``,
and the agent that runs them): slot numbers, file names, environment variable names. It is
public on purpose: the probe and every reader import it, so the format has one definition.

Each probed process owns one directory, ``<probe dir>/<pid>-<start ticks>/``, holding:

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
  ``verifier.evidence.bindings_reader``. Two kinds:

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

The pid in the name is the pid in the probe's own PID namespace; the start time (clock ticks
since boot, field 22 of ``/proc/<pid>/stat``) disambiguates pid reuse.

Stdlib only, no side effects at import: both the probe and the readers import this module.
"""

from __future__ import annotations

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


def process_dir_name(pid: int, start_ticks: int) -> str:
    """Directory name of one process's probe state."""
    return f"{pid}-{start_ticks}"


def stat_fields(stat: bytes) -> list[bytes]:
    """Fields 3.. of a ``/proc/<pid>/stat`` line (the command name may hold spaces and ')')."""
    return stat[stat.rindex(b")") + 2 :].split()


def start_ticks(stat: bytes) -> int:
    """Start time in clock ticks since boot (field 22) from a ``/proc/<pid>/stat`` line."""
    return int(stat_fields(stat)[19])


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
