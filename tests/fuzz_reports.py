"""Hypothesis strategies for tests/test_fuzz_server.py: what a hostile agent or client can put
on the wire to a verifier (Hello, Report, RegisterRun, GetRunStatus), built as real protobuf
messages, and the raw bytes a peer that ignores the schema can send instead.

The reports are structurally valid messages whose values are hostile: huge, negative, NaN,
infinite and far-future numbers, empty and very long ids, unicode and control characters,
many processes, duplicate process keys, manifests whose digest lies or that hold many files,
request bindings with inverted step ranges. Nothing generated here can satisfy the harness's
policy (NEVER_*): no hook, runner class or file digest it pins is ever drawn.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from google.protobuf.message import Message
from hypothesis import strategies as st

from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.model import HASHED_AFTER_SHOWN, FileEntry, manifest_digest
from servewitness.wire.fields import MAX_TEXT

# What the harness's run requires and the generators never produce (filtered out below).
NEVER_HOOK = "fuzz_never_fired"
NEVER_RUNNER = "fuzz.never.GeneratedRunner"
NEVER_FILE = "fuzz_never/pinned.py"
NEVER_SHA = hashlib.sha256(b"no generated file has these bytes").hexdigest()
GOOD_AGENT = "good-agent"  # the well-behaved agent's id: no generated id equals it
NEVER_VALUES = frozenset({NEVER_HOOK, NEVER_RUNNER, NEVER_FILE, NEVER_SHA, GOOD_AGENT})

# Lengths around the wire's per-field text limit, and far past it.
LONG = st.sampled_from([MAX_TEXT - 1, MAX_TEXT, MAX_TEXT + 1, 70_000])
CONTROL = "".join(chr(c) for c in range(32)) + "\x7f\x85\u2028\u2029\u202e\ufeff\u200b"
PLAIN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./", min_size=1, max_size=12)
HOSTILE_TEXT = st.one_of(
    st.just(""),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.text(alphabet=st.sampled_from(CONTROL + "/.:-_ab\\'\"%{}"), max_size=40),
    st.builds(lambda n, c: c * n, LONG, st.sampled_from(["a", "é", "\U0001f600", "\x00"])),
)
# Mostly plausible, so that reports get past the first check and reach storage and judging.
TEXT = st.one_of(PLAIN, PLAIN, PLAIN, HOSTILE_TEXT).filter(lambda s: s not in NEVER_VALUES)
NAME = st.one_of(st.sampled_from(["w", "t", "agent-x", "a" * 64]), TEXT).filter(
    lambda s: s not in NEVER_VALUES
)

INT64_MAX = 2**63 - 1
INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**31, 2**32, 2**53 + 1, INT64_MAX, -(2**63)]),
    st.integers(min_value=-(2**63), max_value=INT64_MAX),
)
SMALL = st.integers(min_value=0, max_value=1000)
COUNT = st.one_of(SMALL, SMALL, SMALL, INT64)
FAR_FUTURE = 253_402_300_800.0  # 10000-01-01T00:00:00Z: past what datetime can print
PLAUSIBLE_TIME = st.floats(min_value=1.6e9, max_value=2.2e9)
TIME = st.one_of(
    PLAUSIBLE_TIME,
    PLAUSIBLE_TIME,
    PLAUSIBLE_TIME,
    st.sampled_from(
        [0.0, -1.0, math.nan, math.inf, -math.inf, 1e300, FAR_FUTURE, FAR_FUTURE - 1, 2.0**63]
    ),
    st.floats(allow_nan=True, allow_infinity=True),
)
SHA = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
    st.sampled_from(["", "AB" * 32, "g" * 64, "0" * 63, "0" * 65]),
).filter(lambda s: s != NEVER_SHA)


# Values the wire accepts and that are still hostile: huge, far-future, odd characters.
VALID_TEXT = st.one_of(
    PLAIN,
    PLAIN,
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40),
    st.text(alphabet=st.sampled_from(CONTROL), min_size=1, max_size=40),
    st.builds(lambda n, c: c * n, st.sampled_from([MAX_TEXT - 1, MAX_TEXT]), st.just("é")),
).filter(lambda s: s not in NEVER_VALUES)
VALID_COUNT = st.one_of(SMALL, SMALL, st.sampled_from([2**31, 2**53 + 1, INT64_MAX]))
VALID_TIME = st.one_of(
    PLAUSIBLE_TIME, PLAUSIBLE_TIME, st.sampled_from([0.0, 1e300, FAR_FUTURE, FAR_FUTURE - 1])
)
VALID_SHA = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64).filter(
    lambda s: s != NEVER_SHA
)


@dataclass(frozen=True)
class Pools:
    """Where one report draws its values: VALID (the wire accepts each one, so the report
    reaches storage and judging) or ANY (hostile everywhere, mostly refused at the edge)."""

    text: st.SearchStrategy[str]
    count: st.SearchStrategy[int]
    int64: st.SearchStrategy[int]
    time: st.SearchStrategy[float]
    sha: st.SearchStrategy[str]


CONTAINER_ID = st.text(alphabet="0123456789abcdef", min_size=12, max_size=64)


def rarely(draw: st.DrawFn, v: Pools) -> bool:
    """True one time in eight for VALID (each such choice makes the report invalid), in two
    for ANY."""
    return draw(st.integers(min_value=0, max_value=7 if v is VALID else 1)) == 0


def fake_sha(i: int) -> str:
    return hashlib.sha256(f"fuzz file {i}".encode()).hexdigest()


def manifest(n: int, start: int = 0) -> list[pb.FileEntry]:
    """N well-formed manifest entries (distinct paths, honest sizes)."""
    return [
        pb.FileEntry(path=f"/fuzz/m{i}.py", sha256=fake_sha(i), size=10, kind="source", at="load")
        for i in range(start, start + n)
    ]


def digest_of(files: list[pb.FileEntry]) -> str:
    return manifest_digest(
        FileEntry(
            f.path,
            f.sha256 if f.HasField("sha256") else None,
            f.size,
            f.kind,
            f.module if f.HasField("module") else None,
            f.at,
        )
        for f in files
    )


VALID = Pools(VALID_TEXT, VALID_COUNT, VALID_COUNT, VALID_TIME, VALID_SHA)
ANY = Pools(TEXT, COUNT, INT64, TIME, SHA)

FILE_COUNT = st.one_of(
    st.integers(min_value=0, max_value=20), st.sampled_from([1000, 5000, 20_000])
)


@st.composite
def files_part(draw: st.DrawFn, p: pb.ProcessReport, v: Pools) -> None:
    """A manifest on P: none, honest, lying about its digest, digest only, or files sent
    without files_included; entries well-formed or hostile."""
    modes = ["none", "honest", "honest", "digest_only", "lie", "no_flag"]
    mode = draw(st.sampled_from(modes[:4] if not rarely(draw, v) else modes))
    if mode == "none":
        return
    files = manifest(draw(FILE_COUNT))
    if draw(st.booleans()):  # a few odd entries among the honest ones
        for _ in range(draw(st.integers(min_value=1, max_value=3))):
            f = pb.FileEntry(
                path=draw(v.text), size=draw(v.int64), kind=draw(v.text), at=draw(v.text)
            )
            if draw(st.booleans()):
                f.sha256 = draw(v.sha)
            if draw(st.booleans()):
                f.identity.size = draw(v.int64)
                f.identity.mtime_ns = draw(v.int64)
            files.append(f)
    if draw(st.booleans()) and files:  # the same path twice with different digests
        files.append(pb.FileEntry(path=files[0].path, sha256=fake_sha(-1), size=1, at="load"))
    honest = digest_of(files) if all(f.sha256 == "" or len(f.sha256) == 64 for f in files) else ""
    digest = {
        "honest": honest or "sha256:" + "3" * 64,
        "lie": "sha256:" + draw(v.sha.filter(lambda s: len(s) == 64 and "sha256:" + s != honest)),
        "digest_only": "sha256:" + draw(v.sha),
        "no_flag": honest or "sha256:" + "4" * 64,
    }[mode]
    p.manifest_digest = digest
    if mode in ("honest", "lie"):
        p.files_included = True
        p.files.extend(files)
    elif mode == "no_flag":
        p.files.extend(files)


@st.composite
def process(draw: st.DrawFn, v: Pools) -> pb.ProcessReport:
    """One process with hostile values in every part the verifier judges."""
    p = pb.ProcessReport(
        key=pb.ProcessKey(boot_id=draw(v.text), pid=draw(v.count), start_ticks=draw(v.count)),
        ns_pid=draw(v.count),
        ppid=draw(v.count),
        start_time=draw(v.time),
        role=draw(st.one_of(st.sampled_from(["worker", "engine_core", "api_server"]), TEXT)),
        cmdline=draw(st.lists(v.text, max_size=3)),
        exe=draw(v.text),
        probe_present=draw(st.booleans()),
        probe_errors=draw(st.lists(v.text, max_size=2)),
        roles=draw(
            st.lists(
                st.sampled_from(["worker", "engine_core", "offline", ""][: 3 if v is VALID else 4]),
                max_size=20,
            )
        ),
    )
    if draw(st.booleans()):
        p.rank = draw(v.int64)
    if draw(st.booleans()):
        p.runner.cls = draw(v.text.filter(lambda s: s != NEVER_RUNNER))
        p.runner.sha256 = draw(v.sha)
        p.runner.file = draw(v.text)
    if draw(st.booleans()):
        s = p.steps
        s.total, s.productive, s.empty = draw(v.count), draw(v.count), draw(v.count)
        s.tokens_scheduled, s.last_step_unix_ns = draw(v.count), draw(v.int64)
        s.decode_steps, s.prefill_steps, s.raised = draw(v.count), draw(v.count), draw(v.count)
        if draw(st.booleans()):
            s.spec.accepted_per_position.extend(draw(st.lists(v.count, max_size=70)))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        h = p.hooks.add(name=draw(v.text), fired=draw(v.count), fired_productive=draw(v.count))
        if draw(st.booleans()):  # an inverted step range as often as a straight one
            h.first_step, h.last_step = draw(v.count), draw(v.count)
        if draw(st.booleans()):
            h.device_fired, h.device_base = draw(v.count), draw(v.count)
    if draw(st.booleans()):
        n = draw(
            st.sampled_from([0, 1, HASHED_AFTER_SHOWN, HASHED_AFTER_SHOWN + 1][: 3 + (v is ANY)])
        )
        p.hashed_after.extend(f"/h{i}" for i in range(n))
        p.hashed_after_count = draw(st.one_of(st.just(n), v.count))
    if draw(st.booleans()):
        p.container_id = draw(v.text)
    draw(files_part(p, v))
    return p


@st.composite
def bindings(draw: st.DrawFn, rep: pb.TargetReport, v: Pools) -> None:
    """Request bindings: spans (step ranges often inverted) and request ids."""
    key = rep.processes[0].key if rep.processes else pb.ProcessKey(pid=1)
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        first, last = sorted((draw(v.count), draw(v.count)), reverse=rarely(draw, v))
        rep.spans.add(
            process=key, internal_id=draw(v.text), first_step=first, last_step=last,
            steps=draw(v.count), tokens=draw(v.count),
            first_unix=draw(v.time), last_unix=draw(v.time),
            manifest_first=draw(v.text), runner=draw(v.text),
        )  # fmt: skip
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        rep.request_ids.add(
            process=key, internal_id=draw(v.text), external_id=draw(v.text), unix=draw(v.time)
        )


PROCESS_COUNT = st.one_of(st.integers(min_value=0, max_value=4), st.sampled_from([100, 1000, 3000]))


@st.composite
def target_report(draw: st.DrawFn, agent_id: str, target: str) -> pb.TargetReport:
    """A report by AGENT_ID on TARGET; seq and nonce are set by the harness (see Attack).
    Two in three draw only values the wire accepts (VALID), one in three anything (ANY)."""
    v = draw(st.sampled_from([VALID, VALID, ANY]))
    rep = pb.TargetReport(
        agent_id=agent_id, target=target, sent_unix=draw(v.time),
        unobservable=draw(st.lists(v.text, max_size=2)),
    )  # fmt: skip
    if draw(st.booleans()):
        rep.collected_unix = draw(v.time)
    if v is VALID and rep.HasField("collected_unix"):
        rep.collected_unix = min(rep.collected_unix, rep.sent_unix)
    procs = draw(st.lists(process(v), min_size=0, max_size=3))
    if v is VALID:  # distinct keys (a duplicate is drawn below, rarely)
        for i, p in enumerate(procs):
            p.key.pid = 100 + i
    rep.processes.extend(procs)
    many = draw(PROCESS_COUNT)
    if many > len(procs):  # many plain processes, distinct or all under one key
        same = draw(st.booleans())
        for i in range(many - len(procs)):
            pid = 7 if same else 1000 + i
            rep.processes.add(
                key=pb.ProcessKey(boot_id="b", pid=pid, start_ticks=1), role="worker",
                start_time=1.7e9, probe_present=True,
            )  # fmt: skip
    if rarely(draw, v) and rep.processes:  # a duplicate key at the end
        rep.processes.add().CopyFrom(rep.processes[0])
    for _ in range(draw(st.integers(min_value=0, max_value=2))):
        rep.containers.add(
            id=draw(st.one_of(st.just("ab" * 6), TEXT)), runtime=draw(v.text), source="cgroup"
        ).labels.update({draw(v.text): draw(v.text)})
    draw(bindings(rep, v))
    return rep


@dataclass
class Attack:
    """A Hello (or none), then a report with the nonce and seq a mode says; metadata naming
    the agent and target (as authorization from metadata will read them) or not."""

    hello_id: str | None  # the id the harness says Hello as; None: no Hello first
    report: pb.TargetReport
    nonce: str  # current | previous | wrong | empty
    seq: str  # next | same | huge | negative | zero
    metadata: str  # matching | other | none
    extra: dict[str, str] = field(default_factory=dict)


@st.composite
def attacks(draw: st.DrawFn) -> Attack:
    ids = st.one_of(PLAIN, PLAIN, PLAIN, VALID_TEXT, NAME)
    agent_id, target = draw(ids), draw(ids)
    hello_id = draw(st.sampled_from([agent_id, agent_id, agent_id, None, "agent-x"]))
    return Attack(
        hello_id=hello_id,
        report=draw(target_report(agent_id, target)),
        nonce=draw(st.sampled_from(["current", "current", "previous", "wrong", "empty"])),
        seq=draw(st.sampled_from(["next", "next", "same", "huge", "negative", "zero"])),
        metadata=draw(st.sampled_from(["matching", "matching", "matching", "other", "none"])),
    )


# Other calls: Hello with hostile ids, RegisterRun with hostile names and policies,
# GetRunStatus of hostile names.
POLICY_TEXT = st.one_of(
    TEXT,
    st.just('version = 1\n[[hooks]]\nname = "h"\n'),  # weak: refused at load
    st.builds(lambda n: "version = 1\n" + "#" * n + "\n", LONG),
    st.builds(lambda n: 'version = 1\n[[files]]\npath = "x"\n' * n, st.sampled_from([1, 2000])),
)
hellos = st.builds(pb.HelloRequest, agent_id=NAME, targets=st.lists(NAME, max_size=4))
registrations = st.builds(pb.RegisterRunRequest, name=NAME, policy_toml=POLICY_TEXT, source=TEXT)
statuses = st.builds(pb.GetRunStatusRequest, name=NAME)

# Raw request bytes: garbage, and valid messages cut short or with bytes flipped.
METHODS = ("Hello", "Report", "RegisterRun", "GetRunStatus")


@st.composite
def raw_requests(draw: st.DrawFn) -> tuple[str, bytes]:
    method = draw(st.sampled_from(METHODS))
    kind = draw(st.sampled_from(["garbage", "truncated", "flipped"]))
    if kind == "garbage":
        return method, draw(st.binary(max_size=300))
    msg: Message
    if method == "Hello":
        msg = pb.HelloRequest(agent_id="agent-x", targets=["t"])
    elif method == "Report":
        msg = pb.ReportRequest(report=draw(target_report(draw(NAME), draw(NAME))))
    elif method == "RegisterRun":
        msg = pb.RegisterRunRequest(name="r", policy_toml="version = 1\n")
    else:
        msg = pb.GetRunStatusRequest(name="fuzz")
    valid = msg.SerializeToString()
    if kind == "truncated":
        return method, valid[: draw(st.integers(min_value=0, max_value=max(0, len(valid) - 1)))]
    data = bytearray(valid)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        if data:
            at = draw(st.integers(min_value=0, max_value=len(data) - 1))
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    return method, bytes(data)
