"""The verifier's input limits: one table, each limit with its value, what it bounds and why
that value. The converters (``servewitness.wire``) and the ingress (``servewitness.server.ingress``)
enforce them; docs/operations.md ("Limits") shows the same table (a test compares them).

A value over a limit is refused with :class:`LimitError` (a :class:`~servewitness.wire.fields.
WireError`, so INVALID_ARGUMENT on the wire) whose message names the limit, its value and the
value received, e.g. ``invalid report.processes: 5000 > limit processes_per_report (4096)``.

The gRPC message limit (``fields.MAX_MESSAGE_BYTES``, 64 MiB) bounds every message as a whole;
these bound what one message may claim inside it, so that the cost of checking and storing a
report is linear in its size and bounded, whoever sends it.
"""

from __future__ import annotations

from typing import NoReturn

from servewitness.wire.fields import UNIX_TIME, Limit, LimitError, enforced, relaxed

__all__ = ["UNIX_TIME", "Limit", "LimitError", "enforced", "relaxed"]  # with the table below


_TABLE = (
    Limit(
        "processes_per_report",
        4096,
        "processes in one report",
        "one target is one vLLM server: a host of 8 GPUs runs a few dozen Python processes "
        "(API server, engine core, one worker per rank); 4096 is 100x that",
    ),
    Limit(
        "files_per_manifest",
        200_000,
        "files in one process's manifest",
        "a live vLLM worker loads tens of thousands of files (about 30,000 with its CUDA "
        "stack); 200,000 is several times that",
    ),
    Limit(
        "files_per_report",
        500_000,
        "manifest entries in one report, all its processes together",
        "the agent sends a manifest only when the verifier lacks it, and once per report "
        "however many processes share it: the first report of a host of 8 workers with "
        "distinct manifests carries about 240,000",
    ),
    Limit(
        "path_bytes",
        4096,
        "bytes of one file path (manifest, native mapping, provenance, drift)",
        "PATH_MAX on Linux",
    ),
    Limit(
        "manifest_path_bytes",
        32 * 1024 * 1024,
        "bytes of all paths of one manifest",
        "200,000 paths of 160 bytes; real paths average under 100",
    ),
    Limit(
        "bindings_per_report",
        100_000,
        "request bindings (spans and request ids) in one report",
        "the agent sends at most a few thousand per report; a backlog drains in several",
    ),
    Limit(
        "keys_per_report",
        4096,
        "entries of gone, mixed_roots and unobservable in one report (each list)",
        "as many as processes_per_report",
    ),
    Limit(
        "containers_per_report",
        1024,
        "containers in one report",
        "one per process at most, in practice one or two per target",
    ),
    Limit(
        "hooks_per_process",
        1024,
        "hooks of one process, and hook counts of one request span",
        "a policy names a few dozen hooks; the probe reports each once",
    ),
    Limit(
        "list_entries",
        65_536,
        "entries of any other repeated field of a process (native mappings, code chains, "
        "log lines, disagreements, drift, provenance files, command line)",
        "native mappings of a worker are a few hundred; provenance files follow the manifest "
        "but list only files that are not pristine",
    ),
    Limit(
        "id_bytes",
        256,
        "bytes of an agent id, target, run name, window id or nonce (and of the agent's "
        "x-verifier-* metadata values)",
        "names people type and hex digests; 256 leaves room for a hostname and a path",
    ),
    Limit(
        "targets_per_hello",
        16,
        "targets one agent names in its Hello (and x-verifier-target metadata entries)",
        "an agent watches one target; a host agent a handful. Its metadata must fit gRPC's "
        "metadata limit (MAX_METADATA_BYTES, 32 KiB): 16 names of 256 bytes, each byte "
        "percent-encoded, are 12 KiB (256 names were refused by gRPC itself)",
    ),
    Limit(
        "policy_bytes",
        1024 * 1024,
        "bytes of a policy's TOML in RegisterRun",
        "the shipped policies are about 2 KiB; 1 MiB is far below the 64 MiB message limit, "
        "so an oversized policy is refused naming this limit, not as a message too large",
    ),
    Limit(
        "entries_per_report",
        131_072,
        "entries of every repeated field of a report's processes, at any depth, manifest "
        "files excepted (native mappings, code chains, log lines, hooks, command line, ...)",
        "each entry is a Python object once read (100-200 bytes) and the latest report of "
        "every target is held: 65,536 empty log lines in each of 40 processes (7.9 MB, "
        "within held_report_bytes) held 300 MiB; a host's report has a few thousand",
    ),
    Limit(
        "report_seq",
        2**53 - 1,
        "a report's sequence number",
        "the agent numbers its next report from the last one the verifier stored: a report "
        "numbered 2**63 - 1 left nothing its agent could number next (protobuf: value out "
        "of range), locking that agent id out; 2**53 - 1 is exact in JSON too, and at two "
        "reports a second lasts 140 million years",
    ),
    Limit(
        "held_report_bytes",
        8 * 1024 * 1024,
        "bytes of a report without its manifests' files and its request bindings: what the "
        "verifier stores as the report and holds in memory as its target's latest",
        "a host's report (processes, native mappings, code chains, containers) is well "
        "under 1 MiB; 8 MiB bounds what each target costs the verifier's memory",
    ),
    Limit(
        "request_ids_per_seal",
        100_000,
        "request ids a harness names in one SealWindow",
        "a benchmark window sends thousands of requests (a minute at 1,000 requests/s is "
        "60,000); each id is looked up in the bindings once, about 10 us, so the longest "
        "list costs a second of the verifier's time",
    ),
    UNIX_TIME,
)

LIMITS: dict[str, Limit] = {x.name: x for x in _TABLE}

PROCESSES_PER_REPORT = LIMITS["processes_per_report"]
FILES_PER_MANIFEST = LIMITS["files_per_manifest"]
FILES_PER_REPORT = LIMITS["files_per_report"]
PATH_BYTES = LIMITS["path_bytes"]
MANIFEST_PATH_BYTES = LIMITS["manifest_path_bytes"]
BINDINGS_PER_REPORT = LIMITS["bindings_per_report"]
KEYS_PER_REPORT = LIMITS["keys_per_report"]
CONTAINERS_PER_REPORT = LIMITS["containers_per_report"]
HOOKS_PER_PROCESS = LIMITS["hooks_per_process"]
LIST_ENTRIES = LIMITS["list_entries"]
ID_BYTES = LIMITS["id_bytes"]
TARGETS_PER_HELLO = LIMITS["targets_per_hello"]
POLICY_BYTES = LIMITS["policy_bytes"]
ENTRIES_PER_REPORT = LIMITS["entries_per_report"]
REPORT_SEQ = LIMITS["report_seq"]
HELD_REPORT_BYTES = LIMITS["held_report_bytes"]
REQUEST_IDS_PER_SEAL = LIMITS["request_ids_per_seal"]


def over(limit: Limit, at: str, got: float) -> NoReturn:
    raise LimitError(at, limit, got)


def at_most(limit: Limit, got: int, at: str) -> int:
    """GOT, or LimitError naming LIMIT when it is above it (unless ``relaxed``)."""
    if got > limit.value and enforced():
        over(limit, at, got)
    return got


def ident(value: str, at: str) -> str:
    """VALUE (an id: agent, target, run, window, nonce) within ``id_bytes``."""
    at_most(ID_BYTES, len(value.encode("utf-8", "surrogatepass")), at)
    return value


def table_markdown() -> str:
    """The table docs/operations.md shows under "Limits"."""
    rows = "".join(f"| `{x.name}` | {x.value} | {x.bounds} | {x.why} |\n" for x in _TABLE)
    return "| limit | value | bounds | why this value |\n|---|---|---|---|\n" + rows
