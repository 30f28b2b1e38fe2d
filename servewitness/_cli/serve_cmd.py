"""``verifier serve``: run the central verifier."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from servewitness._cli.common import positive_seconds
from servewitness.client.address import DEFAULT_ADDRESS, normalize


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="run the central verifier (gRPC): runs, reports, verdicts",
        description="Run the central verifier: agents report to it, clients register runs and "
        "ask for status. Stops gracefully on SIGTERM/SIGINT.",
    )
    p.add_argument(
        "--listen", default=DEFAULT_ADDRESS, help="HOST:PORT, unix:PATH or a socket path"
    )
    p.add_argument(
        "--db",
        default="verifier.sqlite3",
        help="the database: an SQLite file (default verifier.sqlite3) or a postgresql:// URL "
        "(user:password@host:port/dbname) for a fleet",
    )
    p.add_argument(
        "--report-interval",
        type=positive_seconds,
        default=0.5,
        metavar="S",
        help="seconds between agent reports (default 0.5)",
    )
    p.add_argument(
        "--run",
        action="append",
        default=[],
        type=_run_arg,
        metavar="NAME=POLICY",
        help="register run NAME from the policy file POLICY before serving (repeatable); the "
        "same policy again is a no-op; another policy under an existing name leaves that run "
        "its pinned policy and registers the new one as run NAME@<12 hex of its digest> "
        "(logged as run_policy_changed; its ledgered source names the run it changed)",
    )
    p.add_argument(
        "--signing-key",
        type=Path,
        metavar="KEY",
        help="Ed25519 private key (verifier keygen) that signs the ledger's checkpoints; "
        "default: DB.signing.key beside an SQLite database, else in the state directory "
        "($VERIFIER_STATE_DIR, $XDG_STATE_HOME/verifier or ~/.local/state/verifier), "
        "generated at first start and never overwritten. Checkpoints are always signed: at "
        "start, every --checkpoint-interval seconds or --checkpoint-every entries, and at "
        "shutdown; keep one outside the database (`verifier audit checkpoint`) so that "
        "`verifier audit verify --checkpoint` can prove the ledger was not rewritten",
    )
    p.add_argument(
        "--checkpoint-interval", type=float, default=60.0, metavar="S", help="default 60"
    )
    p.add_argument(
        "--target-expiry",
        type=float,
        default=3600.0,
        metavar="S",
        help="a target silent this long (the verifier's boot clock) is expired: left out of "
        "every run's verdict and recorded in the ledger, listed by `verifier target list` until "
        "forgotten; it comes back if it reports again. Must exceed every run's freshness_s "
        "(default 3600)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=1000,
        metavar="N",
        help="also sign a checkpoint once the ledger grew by N entries (default 1000)",
    )
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=64,
        metavar="N",
        help="answer agents' calls (Hello, Report) RESOURCE_EXHAUSTED beyond N in progress "
        "rather than queue without bound (default 64); agents back off and keep their reports "
        "spooled. Status reads have a bound of their own: busy agents never refuse them",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP at http://HOST:PORT/metrics (a bare PORT: "
        "127.0.0.1); off by default (docs/operations.md)",
    )
    p.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="also serve the gRPC health service alone here, in plaintext, for probes that "
        "cannot present a client certificate (kubelet, compose healthchecks); off by default",
    )
    sec = p.add_argument_group(
        "transport security",
        "TLS with client certificates (verifier certs) and/or bearer tokens; without TLS the "
        "verifier runs in INSECURE mode (no authentication), only on a Unix socket or a "
        "loopback address unless --insecure, and warns on every start",
    )
    sec.add_argument("--tls-cert", type=Path, metavar="PEM", help="the verifier's certificate")
    sec.add_argument("--tls-key", type=Path, metavar="PEM", help="its private key")
    sec.add_argument(
        "--tls-client-ca",
        type=Path,
        metavar="PEM",
        help="require every client to present a certificate signed by this CA (mTLS); agents "
        "are then bound to the targets their certificate names",
    )
    sec.add_argument(
        "--tokens",
        type=Path,
        metavar="TOML",
        help="bearer tokens with roles or targets ([[token]] sha256, name, role, targets)",
    )
    sec.add_argument(
        "--local-agent",
        action="append",
        metavar="UID[@CONTAINER][:TARGET,...]",
        help="without TLS, on a Unix socket: the uid whose processes may report (only from a "
        "container whose id starts with CONTAINER, >= 12 hex digits, when given; for these "
        "targets; none named: any), as the kernel says (SO_PEERCRED, /proc/PID/cgroup); "
        "repeatable. Default: the uid this verifier runs as. Others may not report; plaintext "
        "TCP is never authenticated",
    )
    sec.add_argument(
        "--insecure",
        action="store_true",
        help="serve without TLS on a non-local address: anyone who reaches it can report",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="serve from N processes sharing the --listen port (TCP, a fixed port; the kernel "
        "spreads connections over them), each a replica of the others on the one database: "
        "for more cores than one Python process uses. Process I serves metrics on the "
        "--metrics-listen port plus I. A process that exits stops them all (exit 4) "
        "(default 1; docs/operations.md)",
    )
    p.add_argument(
        "--writer-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --processes N > 1: one more process stores every serving process's reports, "
        "so that reports waiting in any of them commit together and the database's write lock "
        "is held by a process with no request threads (default on; --no-writer-process: each "
        "serving process commits its own; docs/operations.md)",
    )
    p.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--as-store-writer", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


def _run_arg(value: str) -> tuple[str, Path]:
    name, eq, path = value.partition("=")
    if not (name and eq and path):
        raise argparse.ArgumentTypeError(f"expected NAME=POLICY_FILE, got {value!r}")
    return name, Path(path)


def run(args: argparse.Namespace) -> int:
    from servewitness.errors import UsageError
    from servewitness.server.app import ServeConfig, VerifierServer

    if args.checkpoint_interval <= 0:
        raise UsageError("--checkpoint-interval must be positive")
    if not args.target_expiry > 0:
        raise UsageError("--target-expiry must be positive")
    if args.checkpoint_every < 1:
        raise UsageError("--checkpoint-every must be at least 1")
    if args.max_concurrent_rpcs < 1:
        raise UsageError("--max-concurrent-rpcs must be at least 1")
    from servewitness.security.tls import ServerTLS

    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_cert is None and args.tls_client_ca is not None:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    tls = ServerTLS(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    if tls is not None and args.insecure:
        raise UsageError("--insecure and --tls-cert contradict each other")
    from servewitness.security.peercred import parse_local_agent

    local_agents = (
        tuple(parse_local_agent(v) for v in args.local_agent) if args.local_agent else None
    )
    from servewitness.server import processes

    listen = normalize(args.listen)
    index = args.process_index
    processes.check_listen(listen, 2 if index > 0 else args.processes)
    from servewitness.server.thread_names import name_threads_as_started

    name_threads_as_started()  # every thread of a server process shows in top -H by name
    if _started_process(args, index):
        return 0
    if args.writer_process is not None and args.processes == 1 and index == 0:
        flag = "--writer-process" if args.writer_process else "--no-writer-process"
        raise UsageError(f"{flag} goes with --processes N > 1 (one process writes its own)")
    config = ServeConfig(
        listen,
        args.db,
        args.report_interval,
        runs=tuple(args.run),
        signing_key=args.signing_key,
        checkpoint_interval_s=args.checkpoint_interval,
        checkpoint_every=args.checkpoint_every,
        tls=tls,
        tokens=args.tokens,
        insecure=args.insecure,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        metrics_listen=processes.metrics_address(args.metrics_listen, index),
        target_expiry_s=args.target_expiry,
        local_agents=local_agents,
        health_listen=args.health_listen,
        container_of=_container_of,
        share_port=args.processes > 1 or index > 0,
        keeps_history=index == 0,  # the first process judges every run for the others
        tune_gc=True,
    )
    if args.processes > 1:
        writer = args.writer_process is not False  # on unless --no-writer-process
        processes.serve(VerifierServer(config), args.processes, sys.argv[1:], writer)
    else:
        server = VerifierServer(config)
        if index > 0:
            from servewitness.server import writer_process

            writer_process.use_from_env(server.store)
        server.serve_forever()
    return 0


def _started_process(args: argparse.Namespace, index: int) -> bool:
    """In a process --processes started (INDEX > 0): check that, and follow the first process.
    True when it is the store's writer process, which has run until told to stop."""
    from servewitness.errors import UsageError
    from servewitness.server import processes

    if index > 0:
        if args.processes != 1:
            raise UsageError("--process-index is given to the processes --processes starts")
        processes.die_with_parent()
    if not args.as_store_writer:
        return False
    if index == 0:
        raise UsageError("--as-store-writer is given to the writer process --processes starts")
    from servewitness.server import writer_process

    writer_process.run_writer(args.db)
    return True


def _container_of(pid: int) -> str | None:
    """The container id of process PID, from /proc/PID/cgroup (what a relayed peer's identity
    names beside its uid); None when it has none or cannot be read."""
    from servewitness.evidence.container import container_from_cgroup

    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    ref = container_from_cgroup(text)
    return ref.id if ref is not None else None
