"""Benchmarks must not rot: every script in bench/ runs in CI in its smoke mode (``--smoke``,
bench/_smoke.py), one test per script so that a broken one is named.

Each test asserts that the script exits 0, that every line it prints is marked as smoke (no
smoke number can pass for a result), and that its output holds the numbers the benchmark
exists to produce (its ratio against the same-run baseline, its noise floor), never how long
anything took. The scripts that need a live vLLM server are given the session's shared one
(``vllm_server``) and boot none. A benchmark added without an entry in EXPECT fails
``test_every_benchmark_has_a_smoke_test``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Sequence
from types import ModuleType

import pytest

from tests.helpers import REPO
from verifier.testing.postgres import PostgresServer
from verifier.testing.vllm_server import VllmServer


def _load_smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_smoke", REPO / "bench" / "_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smoke = _load_smoke()
FLOOR = r"spread \d+\.\d%"  # _stats.print_rows: the noise floor of every arm
# Per script: what its output must hold (regular expressions, each searched in the output).
EXPECT: dict[str, tuple[str, ...]] = {
    "agent_collect.py": (
        r"cold / sha256sum = \d+\.\d+",
        r"report / sha256sum = \d+\.\d+",
        r"bytecode cold / pyc headers = \d+\.\d+",
        r"sidecar CPU at .* of one core",
        FLOOR,
    ),
    "agents_scale.py": (r"3 agents: offered +3/s +acked +[\d.]+/s .*Report p50 .*verifier CPU",),
    "bindings_ledger.py": (
        r"sqlite: ingest(.|\n)*store / raw \(medians\): \d+\.\d+",
        r"postgresql: ingest(.|\n)*store / raw \(medians\): \d+\.\d+",
        r"by request id +p50 +\d+\.\d+ +p99",
        FLOOR,
    ),
    "compare_boots.py": (
        r"1\. the same configuration(.|\n)*tokens_per_s: A [\d.]+",
        r"2\. one client vs four clients(.|\n)*tokens_per_s: A [\d.]+",
        r"noise floor unknown: arm A has one boot",
    ),
    "gate_latency.py": (r"median latency / report interval = \d+\.\d+", FLOOR),
    "hash_scan.py": (
        r"cold / faster sha256sum arm = \d+\.\d+",
        r"rescan / cold = \d+\.\d+",
        FLOOR,
    ),
    "hook_fire.py": (r"fire / baseline call += \d+\.\d+x", r"decorated / plain call", FLOOR),
    "identity_cost.py": (
        r"pyc: identity adds [+-]\d+ ns",
        r"cross-check: [+-]\d+\.\d+ ms per call",
        FLOOR,
    ),
    "index_check.py": (
        r"index_check.compare \(all\) / chain.verify \(medians\): \d+\.\d+",
        r"check_processes \(1 target\) / chain.verify \(medians\): \d+\.\d+",
        FLOOR,
    ),
    "ledger_ingest.py": (r"ledger / raw \(medians\): \d+\.\d+", FLOOR),
    "load_test.py": (
        r"\| 4 \| 4 \| [\d.]+ \(\d+%\) \| [\d.]+ \|",  # the 4-agent row, its ratio to offered
        r"status p50 / baseline",
        r"every ledger verifies: True",
    ),
    "server_throughput.py": (
        r"probe / no-probe = \d+\.\d+ +\(noise floor: boot-to-boot spread up to \d+\.\d+%\)",
        FLOOR,
    ),
    "step_cost.py": (
        r"decode batch 256: bare .* in step +[+-]\d+\.\d .* writer +[+-]\d+\.\d .*\(floor \d+ ns",
        r"mixed +batch 256: ",
        r"spec +batch 256: ",
        r"worst row \(median\): \w+ \d+, [+-]\d+ ns per step",
        r"worst row \(min\): .*budget 2000 ns per step at every batch and shape: (MEETS|OVER)",
        r"with 100 hooks firing once per step",
        FLOOR,
    ),
    "gpu/digest.py": (r'"v2": \{\s*"verdict": "FAIL"', r'"id": "liveness.hook.firing"'),
    "gpu/overhead.py": (r'OVERHEAD \{.*"tokens_per_s": \d', r'"itl_ms": \d'),
    "gpu/overhead_report.py": (r'"ratio_probe_over_none": \d+\.\d+', r'"noise_floor": \{'),
    "gpu/validate.py": (r'deltas: \[\{.*"d_steps_productive": [1-9]', r"policy v2: \d+ rules"),
}


def run_smoke(script: str, cmd: Sequence[str]) -> str:
    """Run CMD (SCRIPT's smoke mode); check its exit, its marks and its numbers."""
    out = subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=300, check=False, cwd=REPO
    )
    tail = f"\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-3000:]}"
    assert out.returncode == 0, f"{script} --smoke exited {out.returncode}{tail}"
    lines = out.stdout.splitlines()
    assert lines and lines[0].startswith(smoke.MARK + "smoke mode"), tail
    unmarked = [line for line in lines if not line.startswith(smoke.MARK)]
    assert not unmarked, f"{script} printed lines not marked as smoke: {unmarked[:3]}"
    text = "\n".join(line.removeprefix(smoke.MARK) for line in lines)
    for pattern in EXPECT[script]:
        assert re.search(pattern, text), f"{script}: no match for {pattern!r}{tail}"
    return text


def test_every_benchmark_has_a_smoke_test() -> None:
    """A new bench/ script without its smoke test (an EXPECT entry) fails here."""
    assert sorted(EXPECT) == smoke.scripts()
    assert set(EXPECT) >= smoke.LIVE


@pytest.mark.parametrize("script", sorted(set(EXPECT) - smoke.LIVE - {"bindings_ledger.py"}))
def test_smoke(script: str) -> None:
    run_smoke(script, smoke.command(script))


def test_smoke_bindings_ledger(postgres: PostgresServer) -> None:
    """On both backends: the session's PostgreSQL (two fresh databases), not one more."""
    dbs = f"{postgres.createdb('bench_ingest')},{postgres.createdb('bench_query')}"
    run_smoke("bindings_ledger.py", smoke.command("bindings_ledger.py", extra=["--pg-dbs", dbs]))


@pytest.mark.vllm
@pytest.mark.parametrize("script", sorted(smoke.LIVE))
def test_smoke_live(script: str, vllm_server: VllmServer) -> None:
    run_smoke(script, smoke.command(script, vllm_server.base_url, vllm_server.pid))


def test_live_scripts_refuse_to_smoke_without_a_server() -> None:
    """Smoke mode never boots a server: without --url/--pid a live script says so, exit 2."""
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hash_scan.py"), "--smoke"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "--smoke needs --url and --pid of a running vLLM server" in out.stderr
