"""Who may call what on the verifier.

A peer's identity is what its client certificate says (mTLS: ``certs.identity_of``) together
with what its bearer token says (a tokens file: ``[[token]]`` entries with the token's
sha256, a name, a role and, for an agent, its targets). Then:

* ``Hello`` / ``Report``: an agent identity (targets) whose name is the agent id it reports
  as, reporting only for its own targets; a name or target covers its instances
  (``agent-vllm/<pod>``, ``vllm/<pod>``: ``servewitness.instances``), so the replicas of one
  Deployment, which share one Secret, report under distinct ids and targets;
* ``RegisterRun``: the ``operator`` role;
* ``GetRunStatus`` / ``ListRuns``: ``operator``, ``harness`` or ``auditor``;
* ``OpenWindow`` / ``SealWindow`` (measurement windows): ``operator`` or ``harness``.

Without TLS (insecure mode) there is no certificate and no token. Plaintext TCP, loopback
included, is never authenticated: evidence over it counts as nobody's (``evidence.unauthenticated``
unless a policy says ``unsafe_allow_unauthenticated``). On a Unix socket the kernel says who the
peer is (``SO_PEERCRED``, read by ``peercred.UnixRelay``): a uid listed as a local agent reports,
as ``unix:uid=U,pid=P``, for the targets it is listed with; any other uid may not report.
Reads and run registration stay open in insecure mode (the socket's file permissions decide).
"""

from __future__ import annotations

import hashlib
import hmac
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import grpc
import structlog

from servewitness.errors import ConfigError
from servewitness.instances import covered
from servewitness.security.peercred import LocalAgent, PeerCred, UnixRelay
from servewitness.security.roles import ROLES, Identity, identity_of

READ_ROLES = frozenset({"operator", "harness", "auditor"})


@dataclass(frozen=True)
class Token:
    sha256: str
    name: str
    role: str | None
    targets: frozenset[str] = field(default_factory=frozenset)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_tokens(path: Path) -> list[Token]:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"--tokens {path}: cannot read: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--tokens {path}: not TOML: {e}") from e
    out = []
    for i, t in enumerate(data.get("token", [])):
        where = f"--tokens {path}: token {i + 1}"
        if not isinstance(t, dict) or set(t) - {"sha256", "name", "role", "targets"}:
            raise ConfigError(f"{where}: keys are sha256, name, role, targets")
        digest, name = t.get("sha256"), t.get("name")
        role, targets = t.get("role"), t.get("targets", [])
        if not (isinstance(digest, str) and len(digest) == 64 and isinstance(name, str)):
            raise ConfigError(f"{where}: needs sha256 (64 hex digits) and name")
        if role is not None and role not in ROLES:
            raise ConfigError(f"{where}: role must be one of {', '.join(ROLES)}")
        if not (isinstance(targets, list) and all(isinstance(x, str) for x in targets)):
            raise ConfigError(f"{where}: targets must be a list of target names")
        if role is None and not targets:
            raise ConfigError(f"{where}: give a role or targets (an agent's)")
        out.append(Token(digest.lower(), name, role, frozenset(targets)))
    if not out:
        raise ConfigError(f"--tokens {path}: no [[token]] entries")
    return out


@dataclass(frozen=True)
class Peer:
    names: tuple[str, ...]
    targets: frozenset[str]
    roles: frozenset[str]
    insecure: bool = False
    unix: PeerCred | None = None  # insecure mode on the Unix socket: what the kernel says

    def describe(self) -> str:
        if self.unix is not None:
            return self.unix.describe()
        return "insecure peer" if self.insecure else "/".join(self.names) or "anonymous"


INSECURE = Peer(("insecure",), frozenset(), frozenset(ROLES), insecure=True)


class Authorizer:
    """SECURE: TLS with client certificates and/or tokens. Otherwise insecure mode: a peer on
    the Unix socket is who the kernel says (RELAY, set by the server when it serves one) and
    reports only when LOCAL_AGENTS lists its uid; a peer over plaintext TCP is nobody."""

    def __init__(
        self,
        secure: bool,
        tokens: Iterable[Token] = (),
        local_agents: Iterable[LocalAgent] = (),
    ) -> None:
        self.secure = secure
        self.tokens = {t.sha256: t for t in tokens}
        self.local_agents = tuple(local_agents)
        self.relay: UnixRelay | None = None

    def authenticated_as(self, peer: Peer) -> str | None:
        """How evidence from PEER was authenticated: the agent's identity (mTLS or a token),
        its kernel credentials (``unix:uid=U,pid=P``: a listed uid on the Unix socket), or
        None (plaintext TCP, loopback included: anyone could have sent it)."""
        if not peer.insecure:
            return "agent " + "/".join(peer.names)
        if peer.unix is not None and any(a.matches(peer.unix) for a in self.local_agents):
            return peer.unix.describe()
        return None

    def peer(self, context: grpc.ServicerContext) -> Peer:
        if not self.secure:
            cred = self.relay.identity(context.peer()) if self.relay is not None else None
            if cred is None:
                return INSECURE
            return Peer((cred.describe(),), frozenset(), frozenset(ROLES), True, cred)
        names: list[str] = []
        targets: set[str] = set()
        roles: set[str] = set()
        pem = context.auth_context().get("x509_pem_cert")
        if isinstance(pem, list) and pem:
            ident: Identity = identity_of(bytes(pem[0]))
            names.append(ident.name)
            targets |= ident.targets
            roles |= ident.roles
        for key, value in context.invocation_metadata():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                digest = token_digest(value[len("Bearer ") :])
                token = next(
                    (t for d, t in self.tokens.items() if hmac.compare_digest(d, digest)), None
                )
                if token is None:
                    _abort(context, grpc.StatusCode.UNAUTHENTICATED, "unknown token")
                names.append(token.name)
                targets |= token.targets
                if token.role:
                    roles.add(token.role)
        return Peer(tuple(names), frozenset(targets), frozenset(roles))

    def require_role(self, context: grpc.ServicerContext, allowed: frozenset[str]) -> Peer:
        p = self.peer(context)
        structlog.contextvars.bind_contextvars(identity=p.describe())  # on every log line
        if not p.insecure and not (p.roles & allowed):
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{p.describe()} may not do this (needs the role {' or '.join(sorted(allowed))})",
            )
        return p

    def require_agent(
        self, context: grpc.ServicerContext, agent_id: str, targets: Iterable[str]
    ) -> Peer:
        p = self.peer(context)
        structlog.contextvars.bind_contextvars(identity=p.describe())  # on every log line
        if p.insecure:
            if p.unix is not None:  # the kernel named it: bound like a certificate
                self._require_local_agent(context, p.unix, frozenset(targets))
            elif self.relay is not None:
                # Serving a Unix socket, a peer without credentials came around it (straight
                # to the private port, or on a connection the relay already closed): refused,
                # so nobody can overwrite a target's latest evidence with anonymous reports.
                _abort(
                    context,
                    grpc.StatusCode.PERMISSION_DENIED,
                    "no identity: report through the verifier's Unix socket, where the kernel "
                    "names the peer",
                )
            return p  # plaintext TCP: accepted, and its evidence is nobody's
        if not p.targets:
            _abort(context, grpc.StatusCode.PERMISSION_DENIED, f"{p.describe()} is not an agent")
        if not covered(p.names, agent_id):  # its name, or an instance of it (NAME/<pod>)
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{p.describe()} may not report as agent {agent_id!r}",
            )
        foreign = sorted(t for t in set(targets) if not covered(p.targets, t))
        if foreign:
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"agent {agent_id!r} may not report for target(s) {', '.join(foreign)} "
                f"(its certificate or token names {', '.join(sorted(p.targets))})",
            )
        return p

    def _require_local_agent(
        self, context: grpc.ServicerContext, cred: PeerCred, targets: frozenset[str]
    ) -> None:
        same_uid = [a for a in self.local_agents if a.uid == cred.uid]
        allowed = [a for a in same_uid if a.matches(cred)]
        if not allowed:
            listed = "; ".join(a.describe() for a in self.local_agents) or "none"
            why = (
                f"it runs in {'container ' + cred.container if cred.container else 'no container'}"
                if same_uid
                else f"uid {cred.uid} is not a local agent of this verifier"
            )
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{cred.describe()} may not report: {why} (--local-agent; listed: {listed})",
            )
        if not any(a.may_report(targets) for a in allowed):
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{cred.describe()} may not report for target(s) {', '.join(sorted(targets))} "
                f"(listed: {'; '.join(a.describe() for a in allowed)})",
            )


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, msg: str) -> NoReturn:
    context.abort(code, msg)
    raise AssertionError("unreachable")  # context.abort raises
