"""``verifier agent``: the sidecar that reports this target's vLLM processes."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness._cli.common import add_verifier_option, positive_seconds, tls_from
from servewitness.client.address import resolve
from servewitness.errors import UsageError
from servewitness.instances import instance_of

if TYPE_CHECKING:
    from servewitness.agent.config import AgentConfig


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="run the sidecar agent: find vLLM processes, report their evidence",
        description="Find the vLLM processes visible here (same PID namespace), read their "
        "probes and /proc, and report them to the verifier every interval. Keeps a bounded "
        "on-disk spool while the verifier is unreachable. Stops on SIGTERM/SIGINT.",
    )
    add_verifier_option(p)
    p.add_argument("--target", default=socket.gethostname(), help="target name (default: hostname)")
    p.add_argument(
        "--instance",
        metavar="NAME",
        help="report as target TARGET/NAME and agent AGENT_ID/NAME, one instance of a family "
        "of replicas (a pod's name, from the downward API: --instance $(VERIFIER_POD_NAME)); a "
        "policy's [targets] replicas_of selects every instance, and a credential for TARGET "
        "and AGENT_ID covers them (docs/policy.md)",
    )
    p.add_argument(
        "--instance-per-container",
        action="store_true",
        help="report the vLLM processes of each container as the instance TARGET/<its "
        "12-hex id>, one target per container: for N serving containers in one PID namespace "
        "(a compose service scaled under one holder), which without it are one target, "
        "evidence.target.mixed; a policy's [targets] replicas_of selects them",
    )
    p.add_argument("--agent-id", help="agent identity (default: HOSTNAME/TARGET)")
    p.add_argument(
        "--pid",
        type=int,
        help="only report this process and its descendants; without it, every vLLM process "
        "visible is reported, and two independent servers seen at once make the target "
        "evidence.target.mixed (never PASS)",
    )
    p.add_argument(
        "--interval",
        type=positive_seconds,
        metavar="S",
        help="seconds between reports (default: the verifier's)",
    )
    p.add_argument(
        "--spool", type=Path, default=Path(".verifier-agent-spool"), help="spool directory"
    )
    p.add_argument(
        "--spool-max-bytes",
        type=int,
        default=64 * 1024 * 1024,
        help="the spool's size limit; past it the oldest reports are dropped (default 64 MiB)",
    )
    p.add_argument(
        "--health",
        metavar="ADDRESS",
        help="serve gRPC health checks here: service '' (liveness) is SERVING while the agent "
        "runs; 'verifier.agent.Delivery' (readiness) only while its last report was "
        "acknowledged and showed a vLLM process",
    )
    p.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus metrics over HTTP at http://HOST:PORT/metrics (a bare PORT: "
        "127.0.0.1); off by default (docs/operations.md)",
    )
    p.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="do not keep pyc compile verdicts in the spool directory across restarts (also "
        "VERIFIER_AGENT_COMPILE_CACHE=0; docs/operations.md)",
    )
    p.add_argument(
        "--no-judgement-cache",
        action="store_true",
        help="do not keep each process's judgement against its distributions in the spool "
        "directory across restarts (also VERIFIER_AGENT_JUDGEMENT_CACHE=0; docs/operations.md)",
    )
    docker = p.add_mutually_exclusive_group()
    docker.add_argument(
        "--docker-socket",
        metavar="PATH",
        default="/var/run/docker.sock",
        help="the Docker API socket, to name each container (name, image, labels) in reports; "
        "when it is missing the reports say so per container (default: %(default)s)",
    )
    docker.add_argument(
        "--no-docker", action="store_true", help="do not ask any Docker API about containers"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from servewitness.agent.runner import Agent

    Agent(config_from(args)).serve_forever()
    return 0


def config_from(args: argparse.Namespace) -> AgentConfig:
    """The agent's configuration from its parsed arguments and environment."""
    from servewitness.agent.config import AgentConfig, default_agent_id

    target, agent_id = args.target, args.agent_id or default_agent_id(args.target)
    if args.instance is not None and args.instance_per_container:
        raise UsageError("--instance and --instance-per-container: one or the other")
    if args.instance is not None:  # both instance-qualified: replicas share one credential
        try:
            target = instance_of(args.target, args.instance)
        except ValueError as e:
            raise UsageError(f"--instance: {e}") from None
        agent_id = f"{agent_id}/{args.instance}"
    return AgentConfig(
        verifier=resolve(args.verifier),
        target=target,
        agent_id=agent_id,
        spool_dir=args.spool,
        spool_max_bytes=args.spool_max_bytes,
        interval_s=args.interval,
        root_pid=args.pid,
        health_listen=args.health,
        docker_socket=None if args.no_docker else args.docker_socket,
        tls=tls_from(args),
        metrics_listen=args.metrics_listen,
        compile_cache=not args.no_compile_cache
        and os.environ.get("VERIFIER_AGENT_COMPILE_CACHE", "1") != "0",
        judgement_cache=not args.no_judgement_cache
        and os.environ.get("VERIFIER_AGENT_JUDGEMENT_CACHE", "1") != "0",
        per_container=args.instance_per_container,
    )
