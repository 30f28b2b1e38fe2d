"""``verifier serve``: lifecycle of the central verifier (Config -> Server -> serve).

SIGTERM/SIGINT stop it gracefully (in-flight RPCs get a grace period); a failure to start
(bad database, address in use) raises ConfigError (exit 3). A background thread keeps the
verdict history current after new evidence arrives, so ingest never waits for evaluation.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from servewitness import wire
from servewitness._stop_signals import stop_on_signals
from servewitness.errors import ConfigError
from servewitness.metrics.health import serve_health
from servewitness.metrics.http import MetricsServer, serve_metrics
from servewitness.policy import PolicyError, load_policy, policy_digest
from servewitness.security.auth import Authorizer, load_tokens
from servewitness.security.peercred import LocalAgent, UnixRelay
from servewitness.security.tls import ServerTLS, is_local, warn_insecure
from servewitness.server import follow, ingress
from servewitness.server.admission import (
    AGENT_METHODS,
    READ_LIMIT,
    READ_METHODS,
    READ_WORKERS,
    Admission,
    ClassPool,
    ReadsFirst,
    grpc_limit,
)
from servewitness.server.audit_service import AuditService
from servewitness.server.db import redact
from servewitness.server.metrics import RpcObserver
from servewitness.server.reflection import add_reflection
from servewitness.server.service import DEFAULT_TARGET_EXPIRY_S, VerifierService, expiry_error
from servewitness.server.store import RunExists, Store

if TYPE_CHECKING:
    from servewitness.ledger.keys import Ed25519PrivateKey

log = structlog.get_logger("verifier.serve")
SERVICE_NAME = "verifier.api.v1.VerifierService"
# The history keeper re-evaluates at most this often: it records verdict changes, while
# status/wait evaluate on demand, so gate latency does not depend on it.
HISTORY_PACE_S = 0.5
# Agents' calls and status reads are admitted by class, each with its own bound and threads
# (server/admission.py): agents keeping their bound full never refuse nor queue a status read.


@dataclass(frozen=True)
class ServeConfig:
    listen: str  # gRPC address: HOST:PORT or unix:PATH
    db: str | Path
    report_interval_s: float = 0.5
    grace_s: float = 5.0
    workers: int = 8
    runs: tuple[tuple[str, Path], ...] = ()  # (name, policy file) registered at start
    # Ed25519 private key that signs the ledger's checkpoints; None: default_key_path(db),
    # generated there at first start. Checkpoints are always signed.
    signing_key: Path | None = None
    tls: ServerTLS | None = None  # None: insecure (local addresses, or insecure=True)
    tokens: Path | None = None  # bearer tokens with roles / targets (see security.auth)
    insecure: bool = False  # serve without TLS on a non-local address (named, warned)
    checkpoint_interval_s: float = 60.0
    checkpoint_every: int = 1000  # also sign once the ledger grew by this many entries
    # Beyond this many agents' calls (Hello, Report) in progress (running or queued for one of
    # the agents' workers), the verifier answers them RESOURCE_EXHAUSTED at once instead of
    # queueing without bound; agents back off and keep the report spooled. Status reads have
    # a bound of their own (server/admission.py). None: no limit.
    max_concurrent_rpcs: int | None = 64
    metrics_listen: str | None = None  # HOST:PORT: Prometheus metrics over HTTP (metrics.py)
    # A target silent this long is expired (in no verdict; ledgered); > every freshness_s.
    target_expiry_s: float = DEFAULT_TARGET_EXPIRY_S
    # HOST:PORT: the gRPC health service alone, in plaintext (kubelet's gRPC probes and a
    # compose healthcheck cannot present a client certificate); it answers nothing else.
    health_listen: str | None = None
    # Insecure mode on a Unix socket: the uids that may report, and for which targets (the
    # kernel's SO_PEERCRED names the peer). None: the uid this verifier runs as, for any target
    # (it owns the database already, so trusting it adds no one); () : nobody.
    local_agents: tuple[LocalAgent, ...] | None = None
    relay_max_connections: int = 64
    relay_first_byte_s: float = 10.0
    relay_idle_s: float = 600.0
    container_of: Callable[[int], str | None] | None = None  # pid -> its container id
    # gRPC server reflection of the services, authorized as status reads are (reflection.py)
    reflection: bool = True
    # One of several processes serving one verifier on one port (server/processes.py): the
    # port is bound with SO_REUSEPORT. Otherwise it is this process's alone (EXCLUSIVE_PORT).
    share_port: bool = False
    # Whether the history keeper re-evaluates every run after new evidence (recording each
    # change in the verdict history and the verdict metrics) and expires silent targets. The
    # other processes of `--processes N` follow the same evidence and their first process does
    # this for them: theirs record only the verdicts their own status calls computed.
    keeps_history: bool = True
    # The process's garbage collector set up for a server that runs for long (memory.tune_gc):
    # process-wide, so the command line's, not a test's or an embedding program's.
    tune_gc: bool = False


def derived_run_name(name: str, digest: str) -> str:
    """The run a changed policy for run NAME is registered under at start: NAME@ and the first
    12 hex digits of the new policy's digest. Named by content, not by a revision number, so a
    verifier restarted again and again with the same changed policy converges on one run
    (registration is a no-op the second time), and two hosts given the same policy agree."""
    return f"{name}@{digest.removeprefix('sha256:')[:12]}"


def register_at_start(store: Store, name: str, path: Path) -> str:
    """Register run NAME from the policy file PATH before serving (a Kubernetes ConfigMap or a
    compose file mounts it); the run name registered. The same policy again is a no-op. A
    different one under an existing name does not refuse to start (a restarting verifier
    would crash-loop on a changed ConfigMap): run NAME keeps the policy it was registered
    with (a run's policy is pinned by digest), and the new policy is registered as a new run
    (``derived_run_name``) whose source, in the ledger, says which run it changed and from
    what."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"--run {name}={path}: cannot read the policy: {e}") from e
    digest = policy_digest(text)
    try:
        load_policy(text, str(path))
        existing = store.get_run(name, missing_ok=True)
        if existing is None or existing.policy_digest == digest:
            rec = store.register_run(name, text, digest, str(path))
        else:
            derived = derived_run_name(name, digest)
            source = (
                f"{path} (--run {name}: a changed policy; run {name} keeps "
                f"{existing.policy_digest})"
            )
            rec = store.register_run(derived, text, digest, source)
            log.warning(
                "run_policy_changed",
                run=name,
                kept=existing.policy_digest,
                new_run=derived,
                policy=digest,
                source=str(path),
            )
    except PolicyError as e:
        raise ConfigError(f"--run {name}={path}: {e.explain()}") from e
    except RunExists as e:
        raise ConfigError(f"--run {name}={path}: {e.explain()}") from e
    log.info("run_registered", run=rec.name, policy=rec.policy_digest, source=str(path))
    return rec.name


def _check_expiry(store: Store, expiry_s: float) -> None:
    """Every stored run's freshness_s below the target expiry (``expiry_error``). A stored
    policy this verifier no longer loads is logged, not fatal: refusing to start on it would
    crash-loop the verifier (its runs answer with the load error instead)."""
    for run in store.list_runs():
        try:
            pol = load_policy(run.policy_toml, run.source)
        except PolicyError as e:
            log.error("stored_policy_unloadable", run=run.name, error=e.explain())
            continue
        why = expiry_error(pol, expiry_s)
        if why is not None:
            raise ConfigError(f"run {run.name}: {why} (give a larger --target-expiry)")


def state_dir() -> Path:
    """Where the verifier keeps what is not in its database when no path is given:
    $VERIFIER_STATE_DIR, else $XDG_STATE_HOME/verifier, else ~/.local/state/verifier."""
    if os.environ.get("VERIFIER_STATE_DIR"):
        return Path(os.environ["VERIFIER_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "verifier"


def default_key_path(db: str | Path) -> Path:
    """The ledger key of database DB when --signing-key is not given: beside an SQLite file
    (DB.signing.key), else in the state directory, named for the database (its URL without
    password), so two verifiers on one host never share a key by accident."""
    name = str(db)
    if "://" not in name and name != ":memory:":
        p = Path(name)
        return p.with_name(p.name + ".signing.key")
    tag = hashlib.sha256(redact(name).encode()).hexdigest()[:12]
    return state_dir() / f"ledger-{tag}.signing.key"


class VerifierServer:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.store = Store(config.db)
        try:
            for name, path in config.runs:
                register_at_start(self.store, name, path)
            _check_expiry(self.store, config.target_expiry_s)
        except ConfigError:
            self.store.close()
            raise
        try:
            self._key, self.key_path, self.key_created = self._ledger_key(config)
        except ConfigError:
            self.store.close()
            raise
        self._signed_size = 0  # the ledger's size at the last checkpoint this verifier signed
        try:
            auth = self._authorizer(config)
        except ConfigError:
            self.store.close()
            raise
        self.service = VerifierService(
            self.store,
            config.report_interval_s,
            auth,
            config.target_expiry_s,
            self._key,
            max_window_waits=max(1, config.workers // 2),  # the rest serve agents and reads
        )
        self.health = health.HealthServicer()
        opts = [*wire.GRPC_OPTIONS, *self._port_option()]
        limit = config.max_concurrent_rpcs
        self.reads_first = ReadsFirst()
        self.admission = Admission(
            (
                (
                    AGENT_METHODS,
                    ClassPool("agents", config.workers, limit, self.reads_first.turn),
                ),
                (
                    READ_METHODS,
                    ClassPool("status", READ_WORKERS, None if limit is None else READ_LIMIT),
                ),
            ),
            on_busy=self._refused,
        )
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.workers),
            options=opts,
            maximum_concurrent_rpcs=grpc_limit(limit),
            interceptors=[RpcObserver(self.service.metrics), self.admission],
        )
        self.audit = AuditService(self.store, self._key, auth)  # same listener, same auth
        # Both through the ingress: callers authorized before their bytes are parsed.
        services = {"VerifierService": self.service, "AuditService": self.audit}
        reading = dict.fromkeys(READ_METHODS, self.reads_first.reading)  # once authorized
        ingress.add_services(self.server, services, auth, reading)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.reflection = add_reflection(self.server, auth) if config.reflection else None
        self.port = 0
        self.health_port = 0
        self.health_server: grpc.Server | None = None
        self.relay: UnixRelay | None = None
        self.metrics_http: MetricsServer | None = None
        self._stop = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep_history, name="verdict-history", daemon=True
        )
        # what other verifiers on the same database store (server/follow.py)
        self.follower = follow.Follower(
            self.store,
            self.service.evaluator,
            metrics=self.service.metrics,
            expiry_s=self.service.target_expiry_s,
            receipt_key=self.service.receipt_key,
        )
        self._following = threading.Thread(
            target=follow.run,
            args=(
                self.follower,
                self._stop,
                self.service.dirty.set,
                functools.partial(self.reads_first.turn, "follow"),
            ),
            name="follow-store",
            daemon=True,
        )

    def _port_option(self) -> tuple[tuple[str, int], ...]:
        """The port alone, or shared with the verifier's other processes (--processes)."""
        return wire.SHARED_PORT if self.config.share_port else wire.EXCLUSIVE_PORT

    @staticmethod
    def _ledger_key(config: ServeConfig) -> tuple[Ed25519PrivateKey, Path, bool]:
        """The key that signs checkpoints: the one given, or the default one, made at first
        start and reused ever after (never overwritten)."""
        from servewitness.ledger.keys import load_or_generate, load_private_key

        if config.signing_key is not None:
            return load_private_key(config.signing_key), config.signing_key, False
        path = default_key_path(config.db)
        key, created = load_or_generate(path)
        return key, path, created

    def key_line(self) -> str:
        """Who signs this verifier's checkpoints, for the start-up output."""
        from servewitness.ledger import note
        from servewitness.ledger.keys import key_id, public_path

        pub = self._key.public_key()
        made = "generated now" if self.key_created else "kept"
        vkey = note.verifier_key(note.origin(pub), pub)
        return (
            f"ledger checkpoints signed by key {key_id(pub)[:16]} ({made}; public key "
            f"{public_path(self.key_path)}; note verifier key {vkey})"
        )

    @staticmethod
    def _authorizer(config: ServeConfig) -> Authorizer:
        if config.tls is None:
            if config.tokens is not None:
                raise ConfigError("--tokens needs TLS (--tls-cert, --tls-key): no tokens in clear")
            if not (config.insecure or is_local(config.listen)):
                raise ConfigError(
                    f"refusing to serve {config.listen} without TLS: give --tls-cert, --tls-key "
                    "and --tls-client-ca (or --tokens), or --insecure to accept that anyone who "
                    "reaches this address can report evidence and read verdicts"
                )
            agents = config.local_agents
            if agents is None:
                agents = (LocalAgent(os.getuid()),)
            return Authorizer(secure=False, local_agents=agents)
        if config.local_agents:
            raise ConfigError(
                "--local-agent is for a Unix socket without TLS (with TLS, agents "
                "are who their certificates say)"
            )
        if config.tls.client_ca is None and config.tokens is None:
            raise ConfigError(
                "TLS without --tls-client-ca or --tokens: nobody could authenticate (agents need "
                "a client certificate or a token naming their targets)"
            )
        return Authorizer(True, load_tokens(config.tokens) if config.tokens else ())

    def start(self) -> None:
        from servewitness.server.memory import tune_gc

        self.follower.begin()
        if self.config.tune_gc:  # after the evidence loaded at start (process-wide)
            tune_gc()
        self.metrics_http = serve_metrics(self.config.metrics_listen, self.service.metrics.registry)
        try:
            if self.config.tls is not None:
                creds = self.config.tls.credentials()
                self.port = self.server.add_secure_port(self.config.listen, creds)
            elif self.config.listen.startswith("unix:"):
                warn_insecure(f"serving on {self.config.listen}")
                # The public socket is the relay's (kernel credentials of each peer); gRPC
                # listens on a private loopback port behind it (security/peercred.py).
                self.port = self.server.add_insecure_port("127.0.0.1:0")
            else:
                warn_insecure(f"serving on {self.config.listen}")
                self.port = self.server.add_insecure_port(self.config.listen)
        except RuntimeError as e:
            raise ConfigError(f"cannot listen on {self.config.listen}: {e}") from e
        if self.port == 0:
            raise ConfigError(f"cannot listen on {self.config.listen}")
        if self.config.tls is None and self.config.listen.startswith("unix:"):
            self.relay = UnixRelay(
                Path(self.config.listen[len("unix:") :]),
                self.port,
                max_connections=self.config.relay_max_connections,
                first_byte_s=self.config.relay_first_byte_s,
                idle_s=self.config.relay_idle_s,
                container_of=self.config.container_of,
            )
            self.service.auth.relay = self.relay
        self.server.start()
        if self.relay is not None:
            self.relay.start()
        if self.config.health_listen is not None:
            self._serve_health(self.config.health_listen)
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._keeper.start()
        self._following.start()
        db = redact(str(self.config.db))
        mode = "insecure" if self.config.tls is None else "tls"
        log.info("serving", listen=self.config.listen, port=self.port, db=db, transport=mode)
        log.info("ledger_key", detail=self.key_line())

    def _serve_health(self, address: str) -> None:
        """The health service alone on ADDRESS, without TLS: it says SERVING or NOT_SERVING
        and nothing of runs, evidence or verdicts."""
        self.health_server, self.health_port = serve_health(
            address, self.health, "--health-listen", self._port_option()
        )

    def _keep_history(self) -> None:
        from servewitness.server.memory import Trimmer, fix_mmap_threshold

        next_checkpoint = 0.0
        fix_mmap_threshold()  # a large report's freed memory given back (server/memory.py)
        trimmer = Trimmer()
        while not self._stop.is_set():
            self.service.dirty.wait(timeout=1.0)  # also re-evaluates on time (STALE)
            self.service.dirty.clear()
            try:
                with self.reads_first.turn("history"):  # a status call running goes first
                    if self.config.keeps_history:
                        self.service.refresh_verdicts()
                    else:
                        self.service.record_seen()
            except Exception as e:  # noqa: BLE001 - the keeper logs and keeps going
                log.error("history_failed", error=f"{type(e).__name__}: {e}")
            trimmer.maybe_trim()
            due = time.monotonic() >= next_checkpoint
            if due or self._grown() >= self.config.checkpoint_every:
                next_checkpoint = time.monotonic() + self.config.checkpoint_interval_s
                self._checkpoint()
            self._stop.wait(HISTORY_PACE_S)

    def _refused(self, method: str) -> None:
        """A call refused busy: an agent's slows the agents' pace (server/pacing.py)."""
        if method in AGENT_METHODS:
            self.service.pacer.refused()

    def _grown(self) -> int:
        """Entries appended since the last checkpoint this verifier signed."""
        try:
            return self.store.ledger_size() - self._signed_size
        except self.store.errors:
            return 0

    def _checkpoint(self) -> None:
        """Sign the ledger's tree head if it grew. A failure is logged, and tried again at
        the next interval or after the next --checkpoint-every entries, not at once."""
        try:
            self._signed_size = max(self._signed_size, self.store.ledger_size())
            cp = self.store.sign_checkpoint(self._key)
        except Exception as e:  # noqa: BLE001 - logged; the next interval tries again
            log.error("checkpoint_failed", error=f"{type(e).__name__}: {e}")
            return
        if cp is not None:
            self._signed_size = cp.size
            log.info("checkpoint", size=cp.size, root=cp.root)

    def stop(self) -> None:
        self._stop.set()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.server.stop(self.config.grace_s).wait()
        self.admission.shutdown()
        if self.reflection is not None:
            self.reflection.shutdown(wait=False)
        if self.health_server is not None:
            self.health_server.stop(0).wait()
        if self.relay is not None:
            self.relay.stop()
        self.service.dirty.set()  # wake the history keeper so it sees _stop and ends
        if self._keeper.is_alive():
            self._keeper.join(timeout=10)
        if self._following.is_alive():
            self._following.join(timeout=10)
        self._checkpoint()  # the last word: what this verifier stored, signed
        self.store.close()
        if self.metrics_http is not None:
            self.metrics_http.stop()
        log.info("stopped")

    def serve_forever(self) -> None:
        """Start, block until SIGTERM/SIGINT, stop gracefully; previous handlers restored."""
        stop = threading.Event()
        with stop_on_signals(stop):
            try:
                self.start()
                print(f"verifier listening on {self.config.listen} (port {self.port})", flush=True)
                print(self.key_line(), flush=True)
                # a timed wait: a signal taken by another thread only sets a flag, which the
                # main thread acts on when it next runs Python; an untimed wait on a lock never
                # does (seen: a verifier paused by SIGSTOP and resumed ignored SIGTERM for good)
                while not stop.wait(0.5):
                    pass
            finally:
                self.stop()
