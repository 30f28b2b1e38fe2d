"""gRPC server reflection on a real verifier, read by grpcio-reflection's own client
(``ProtoReflectionDescriptorDatabase``, what tools build on): it lists the services and gives
their methods; with TLS it obeys the verifier's authorization as a status read does (a
client certificate or bearer token with a reading role; an agent's certificate, another CA's
or no credentials get nothing); turned off, the service is not there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from servewitness import wire
from servewitness.security.tls import ServerTLS
from servewitness.testing.vllm_server import free_port
from tests.helpers import running_verifier, verifier_cli
from tests.test_security import certs

EXPECTED = {
    "verifier.api.v1.VerifierService",
    "verifier.api.v1.AuditService",
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
}


def services(channel: grpc.Channel) -> set[str]:
    return set(ProtoReflectionDescriptorDatabase(channel).get_services())


def methods(channel: grpc.Channel, service: str) -> set[str]:
    pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
    return {m.name for m in pool.FindServiceByName(service).methods}


def refused(channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        services(channel)
    code: grpc.StatusCode = e.value.code()
    return code


def test_reflection_lists_the_services_and_their_methods(tmp_path: Path) -> None:
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db.sqlite3") as server,
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        assert services(ch) == EXPECTED
        assert {"Hello", "Report", "GetRunStatus", "OpenWindow"} <= methods(
            ch, "verifier.api.v1.VerifierService"
        )
        assert "AuditRun" in methods(ch, "verifier.api.v1.AuditService")
        assert methods(ch, "grpc.health.v1.Health") >= {"Check", "Watch"}
        # reflection takes none of the other calls' threads, and the server still answers
        assert server.reflection is not None
        assert server.reflection._max_workers == 2


def test_reflection_turned_off_is_not_served(tmp_path: Path) -> None:
    """The negative control: the same client against a verifier without reflection."""
    addr = f"unix:{tmp_path}/v.sock"
    with (
        running_verifier(addr, tmp_path / "db.sqlite3", reflection=False),
        grpc.insecure_channel(addr, options=list(wire.GRPC_OPTIONS)) as ch,
    ):
        assert refused(ch) == grpc.StatusCode.UNIMPLEMENTED


def _tls_channel(
    d: Path, who: str | None, addr: str, token: str | None = None, ca: Path | None = None
) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=(d / "ca.pem").read_bytes(),
        private_key=(ca or d).joinpath(f"{who}.key").read_bytes() if who else None,
        certificate_chain=(ca or d).joinpath(f"{who}.pem").read_bytes() if who else None,
    )
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(addr, creds, options=list(wire.GRPC_OPTIONS))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The lab CA of tests/test_security.py; its "other" CA beside it."""
    yield certs(tmp_path_factory.mktemp("pki"))


def test_reflection_over_mutual_tls_needs_a_reading_role(tmp_path: Path, pki: Path) -> None:
    addr = f"127.0.0.1:{free_port()}"
    tls = ServerTLS(pki / "verifier.pem", pki / "verifier.key", pki / "ca.pem")
    with running_verifier(addr, tmp_path / "db.sqlite3", tls=tls):
        for who in ("ops", "audit"):
            with _tls_channel(pki, who, addr) as ch:
                assert services(ch) == EXPECTED, who
        with _tls_channel(pki, "agent-a", addr) as ch:  # an agent: targets, no role
            assert refused(ch) == grpc.StatusCode.PERMISSION_DENIED
        with _tls_channel(pki, None, addr) as ch:  # no client certificate: no handshake
            assert refused(ch) == grpc.StatusCode.UNAVAILABLE
        with _tls_channel(pki, "ops", addr, ca=pki.parent / "other") as ch:  # another CA's
            assert refused(ch) == grpc.StatusCode.UNAVAILABLE


def test_reflection_over_tls_with_tokens_needs_a_known_token_with_a_role(
    tmp_path: Path, pki: Path
) -> None:
    tokens = {}
    entries = []
    for name, role in (("ci", "harness"), ("agent", None)):
        args = ["certs", "token", "--name", name]
        args += ["--role", role] if role else ["--target", "a"]
        out = verifier_cli(*args)
        assert out.returncode == 0, out.stderr
        tokens[name] = out.stdout.split()[1]
        entries.append(out.stdout.split("\n", 2)[2])
    (tmp_path / "tokens.toml").write_text("\n".join(entries))
    addr = f"127.0.0.1:{free_port()}"
    tls = ServerTLS(pki / "verifier.pem", pki / "verifier.key")
    with running_verifier(addr, tmp_path / "db.sqlite3", tls=tls, tokens=tmp_path / "tokens.toml"):
        with _tls_channel(pki, None, addr, token=tokens["ci"]) as ch:
            assert services(ch) == EXPECTED
        with _tls_channel(pki, None, addr, token=tokens["agent"]) as ch:
            assert refused(ch) == grpc.StatusCode.PERMISSION_DENIED
        with _tls_channel(pki, None, addr, token="forged") as ch:  # noqa: S106 - not a secret
            assert refused(ch) == grpc.StatusCode.UNAUTHENTICATED
        with _tls_channel(pki, None, addr) as ch:  # TLS, no credentials at all
            assert refused(ch) == grpc.StatusCode.PERMISSION_DENIED
