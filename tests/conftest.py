"""Session fixtures: the tiny model and ONE real vLLM server (CPU) shared by every vllm test.

The server is started once per session (about 45 s on two cores) with every hook the tests
need declared up front, including a malformed entry that must not break start-up.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servewitness.testing.postgres import PostgresServer, PostgresUnavailable
from servewitness.testing.vllm_server import VllmServer
from tests import boot_ahead
from tests.helpers import REPO, Backend

V2_STEP = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.execute_model"
V1_STEP = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model"
V1_SAMPLE = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens"
V1_LOAD = "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model"  # start-up only
# warm-up only: runs once after the KV cache exists, before the first step (on this CPU
# server, eager with an explicit KV-cache size, it runs no forward pass: no dummy step)
V1_WARM = "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model"
# the speculative path (drafter, rejection sampler): dead in this server (no speculation),
# alive in tests/test_spec_live.py's
SPEC_PROPOSE = "vllm.v1.spec_decode.ngram_proposer:NgramProposer.propose"
SPEC_REJECT = "vllm.v1.sample.rejection_sampler:RejectionSampler.forward"
SERVER_HOOKS = {
    "v2_step": V2_STEP,
    "v1_step": V1_STEP,
    "v1_sample": V1_SAMPLE,
    "v1_module": "vllm.v1.worker.gpu_model_runner",
    "v1_load": V1_LOAD,
    "warm": V1_WARM,
    "fwd_dev": "vllm.model_executor.models.llama:LlamaModel.forward@device",
    "v1_first": "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states@first",
    "user_step": "verifier_user_hook:on_step",
    "missing_attr": "vllm.v1.worker.gpu_model_runner:NoSuchRunner.execute_model",
    "spec_propose": SPEC_PROPOSE,
    "spec_reject": SPEC_REJECT,
}
MALFORMED_ENTRY = "this entry has no equals sign"


@pytest.fixture(scope="session", autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A verifier started without --signing-key on PostgreSQL keeps its generated ledger key
    in the state directory: one under the session's temporary directory, not the home's."""
    before = os.environ.get("VERIFIER_STATE_DIR")
    os.environ["VERIFIER_STATE_DIR"] = str(tmp_path_factory.mktemp("verifier-state"))
    yield
    if before is None:
        os.environ.pop("VERIFIER_STATE_DIR", None)
    else:
        os.environ["VERIFIER_STATE_DIR"] = before


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight Llama (built on first use; `make model` builds it too)."""
    path = Path(os.environ.get("VERIFIER_TINY_MODEL", REPO / ".cache" / "tiny-llama"))
    from servewitness.testing import tiny_model as tm

    if not tm.is_built(path, "float32"):
        # In a subprocess: torch and transformers stay out of the test process.
        subprocess.run(
            [sys.executable, "-m", "servewitness.testing.tiny_model", str(path)], check=True
        )
    return path


def _shared_server(model: Path) -> VllmServer:
    hooks = ",".join(f"{k}={v}" for k, v in SERVER_HOOKS.items()) + "," + MALFORMED_ENTRY
    user_hooks = REPO / "tests" / "data" / "user_hooks"
    env = {
        "VERIFIER_HOOKS": hooks,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(user_hooks), os.environ.get("PYTHONPATH")])
        ),
    }
    return VllmServer(
        model,
        env=env,
        # Chat requests bring their own template (the tiny model has none).
        extra_args=("--no-enable-prefix-caching", "--trust-request-chat-template"),
        scratch_parent=REPO / ".scratch",
    )


SHARED_SERVER = boot_ahead.register("shared server", __name__, _shared_server)


@pytest.fixture(scope="session")
def boot_pool(request: pytest.FixtureRequest) -> Iterator[boot_ahead.BootPool]:
    """The servers this session's modules registered (tests/boot_ahead.py), each booted
    beside the one before it (off: each alone); the shared server where its first user runs."""
    modules = []
    for item in request.session.items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            modules.append(__name__)
        if (module := getattr(item, "module", None)) is not None:
            modules.append(module.__name__)
    order = boot_ahead.needed(modules)
    model = request.getfixturevalue("tiny_model") if order else None
    pool = boot_ahead.BootPool(model, order if boot_ahead.enabled() else ())
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def docker_images() -> None:
    """A Docker engine that answers and this project's images (scripts/docker-host.sh, then
    scripts/images.sh; both idempotent, the images cached). Fails, never skips: `make test`
    runs the container tests on every machine of this project's kind. Under pytest-xdist the
    workers take turns (a file lock): the second finds the images the first built."""
    lock_path = REPO / ".cache" / "docker-images.lock"
    lock_path.parent.mkdir(exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for script, limit in (("docker-host.sh", 600), ("images.sh", 1800)):
            out = subprocess.run(
                [str(REPO / "scripts" / script)],
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
            )
            if out.returncode != 0:
                pytest.fail(
                    f"scripts/{script} failed ({out.returncode}):\n{out.stdout}{out.stderr}"
                )


@pytest.fixture(scope="session")
def vllm_server(boot_pool: boot_ahead.BootPool) -> Iterator[VllmServer]:
    started_ns = time.time_ns()
    server = boot_pool.take(SHARED_SERVER)
    try:
        yield server
    finally:
        server.stop()
    spec = importlib.util.find_spec("vllm")  # found, not imported: torch stays out
    assert spec is not None and spec.origin is not None
    moved = _changed_since(Path(spec.origin).parent, started_ns)
    if moved:
        pytest.fail(
            f"{len(moved)} files of the installed vLLM changed (ctime) while the shared server "
            f"ran from them, e.g. {moved[:3]}: a test hard-linked, chmod-ed or rewrote them, "
            "and every provenance finding of the shared server after that is about the test "
            "(copy files instead, or use a server of its own)"
        )


def _changed_since(tree: Path, since_ns: int) -> list[str]:
    """Files under TREE whose ctime is later than SINCE_NS, sorted."""
    out = []
    for parent, _, names in os.walk(tree):
        for name in names:
            path = os.path.join(parent, name)
            try:
                if os.lstat(path).st_ctime_ns > since_ns:
                    out.append(path)
            except OSError:
                continue
    return sorted(out)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The gate tests first: they need the shared vLLM server before any request reached it."""
    items.sort(key=lambda item: 0 if item.path.name == "test_gate_e2e.py" else 1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """ONE real PostgreSQL server (Debian's package; scripts/postgres-host.sh installs it) for
    the session; each test takes its own database from it (``pg_database``). Fails, never
    skips: the PostgreSQL backend must pass the same tests as SQLite."""
    try:
        server = PostgresServer().start()
    except (PostgresUnavailable, subprocess.SubprocessError) as e:
        pytest.fail(f"cannot start PostgreSQL: {e}")
    try:
        yield server
    finally:
        server.stop()


_pg_databases = iter(range(1, 1_000_000))


@pytest.fixture
def pg_database(postgres: PostgresServer) -> str:
    """A fresh database on the session's PostgreSQL server: its URL."""
    return postgres.createdb(f"t{next(_pg_databases)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        return Backend(str(tmp_path / "db.sqlite3"))
    return Backend(request.getfixturevalue("pg_database"))
