"""Benchmarks must not rot: every script in bench/ runs in CI in its smoke mode (``--smoke``,
bench/_smoke.py), one test per script so that a broken one is named.

Each test asserts that the script exits 0, that every line it prints is marked as smoke (no
smoke number can pass for a result), and that its output holds the numbers the benchmark
exists to produce (its ratio against the same-run baseline, its noise floor), never how long
anything took; its rows (``_stats.print_rows``) must parse back (``_stats.parse_rows``), at
least two of them (an arm and its baseline) where the script reports a noise floor. The
harness itself has negative controls (``test_harness_catches``): a script whose measured
function raises, one that prints no ratio, one with an unmarked line, one with a row that
does not parse, each fails the check that would let it rot. The scripts that need a live
vLLM server are given the session's shared one (``vllm_server``) and boot none. A benchmark
added without an entry in EXPECT fails ``test_every_benchmark_has_a_smoke_test``.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from servewitness.testing.postgres import PostgresServer
from servewitness.testing.vllm_server import VllmServer
from tests.helpers import REPO


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


smoke = _load("_smoke")
stats = _load("_stats")
# _stats.print_rows: the noise floor of every arm. A script whose EXPECT holds FLOOR must
# also print at least two rows that parse (an arm and its baseline, in one run).
FLOOR = r"spread \d+\.\d%"
# Scripts whose baseline is a setting, not a measured row (gate latency: the report interval).
BASELINE_NOT_A_ROW = frozenset({"gate_latency.py"})
# Per script: what its output must hold (regular expressions, each searched in the output).
EXPECT: dict[str, tuple[str, ...]] = {
    "agent_collect.py": (
        r"cold / sha256sum = \d+\.\d+",
        r"report / sha256sum = \d+\.\d+",
        r"bytecode cold / pyc headers = \d+\.\d+",
        r"sidecar CPU at .* of one core",
        FLOOR,
    ),
    "agents_scale.py": (
        r"3 agents: offered 6/s acked [\d.]+/s, verifier [\d.]+ ms CPU per report",
        r"\| this tree \| 3 \| 6 \| [\d.]+ \(\d+%\) \| [\d.]+x \| [\d.]+ \(\d+%\) \|",
        r"\| 2 processes \| 3 \| 6 \| [\d.]+ \(\d+%\) \| [\d.]+x \| [\d.]+ \(\d+%\) \|",
        # the floor's CPU over 1 s can be below one clock tick: its spread is then NaN
        r"\| gRPC floor \| 3 \| 6 \| [\d.]+ \(\d+%\) \| [\d.]+x \| [\d.]+ \((\d+|nan)%\) \|",
        r"every acknowledged report stored: True",
    ),
    "bindings_ledger.py": (
        r"sqlite: ingest(.|\n)*store / raw \(medians\): \d+\.\d+",
        r"postgresql: ingest(.|\n)*store / raw \(medians\): \d+\.\d+",
        r"by request id +p50 +\d+\.\d+ +p99",
        FLOOR,
    ),
    "cold_manifest.py": (
        r"\d+ files \(\d+ recorded by the probes, \d+ more mapped native\)",
        r"cold / openssl, wall +median +\d+\.\d+ .* spread \d+\.\d%",
        r"restart / openssl, wall +median +\d+\.\d+ .* spread \d+\.\d%",
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
    "bindings_record.py": (
        r"line / json = \d+\.\d+ \(paired per round",
        r"json2 / json = \d+\.\d+ \(paired per round",
        FLOOR,
    ),
    "cli_start.py": (
        r"verifier wait --help / python = \d+\.\d+",
        r"named / every command = \d+\.\d+",
        r"terminal-safe, clean / plain write = \d+\.\d+",
        FLOOR,
    ),
    "identity_cost.py": (
        r"pyc: identity adds [+-]\d+ ns",
        r"cross-check: [+-]\d+\.\d+ ms per call",
        FLOOR,
    ),
    "import_check.py": (r"pyc: the check adds [+-]\d+ ns per import", FLOOR),
    "index_check.py": (
        r"index_check.compare \(all\) / chain.verify \(medians\): \d+\.\d+",
        r"check_processes \(1 target\) / chain.verify \(medians\): \d+\.\d+",
        FLOOR,
    ),
    "ledger_ingest.py": (r"ledger / raw \(medians\): \d+\.\d+", FLOOR),
    "seal_requests.py": (
        r"request_steps / indexed lookup at \d+ ids = \d+\.\d+ \(paired per round",
        r"longest hold of the store's lock by one chunk of \d+ ids: \d+\.\d+ ms",
        FLOOR,
    ),
    "audit_absence.py": (
        r"not found / read rows at \d+ = \d+\.\d+ \(paired per round",
        r"not found / found at \d+ = \d+\.\d+ \(paired per round",
        r"not found: \d+\.\d+ us per stored row",
        FLOOR,
    ),
    "seal_history.py": (
        r"with count / no count at \d+ windows = \d+\.\d+ \(paired per round",
        r"the count adds -?\d+\.\d+ ms per seal",
        FLOOR,
    ),
    "ledger_audit.py": (
        r"both arms' root and proof equal: True",
        r"kept tree / whole ledger at \d+ entries = \d+\.\d+ \(paired per round",
        FLOOR,
    ),
    "load_test.py": (
        r"\| 4 \| 4 \| [\d.]+ \(\d+%\) \| [\d.]+ \|",  # the 4-agent row, its ratio to offered
        r"status p50 / baseline",
        r"every ledger verifies: True",
    ),
    "report_path.py": (
        r"this tree again / this tree = \d+\.\d+ \(CPU, paired per round, median\)",
        r"this tree again / this tree = \d+\.\d+ \(write lock held, paired, median\)",
        r"this tree again / this tree = \d+\.\d+ \(conversions, paired per round, median\)",
        r"Conversions per report, ms CPU",
        r"Reports per transaction, over the rounds:",
        r"this tree / floor = \d+\.\d+",
        FLOOR,
    ),
    "replicas_scale.py": (
        r"1 verifier\(s\): 3 agents offered 6/s acked [\d.]+/s",
        r"2 verifier\(s\): 6 agents offered 12/s acked [\d.]+/s",
        r"\| 2 \| 6 \| 12 \| [\d.]+ \(\d+%\) \| [\d.]+x \|",
        r"every acknowledged report stored and every target on every verifier: True",
    ),
    "server_throughput.py": (
        r"probe / no-probe = \d+\.\d+ +\(noise floor: boot-to-boot spread up to \d+\.\d+%\)",
        FLOOR,
    ),
    "status_answer.py": (
        r"the same answer from every arm: True",
        r"findings kept / built per call = \d+\.\d+",
        r"verdicts kept / findings kept = \d+\.\d+",
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
    "tokens_ab.py": (
        r"switch check: probe steps counted in B and D phases only .*: True",
        r"estimator: paired median(.|\n)*estimator: fastest decile",
        r"A/A \(off / off\) = \d+\.\d+  95 % interval \[.*\]  A/A floor ±\d+\.\d+ %",
        r"probe / no-probe = \d+\.\d+  95 % interval \[\d+\.\d+, \d+\.\d+\]",
        r"control \(\+1 % of a step, busy\) / no-probe = \d+\.\d+ .*seen: (True|False)",
        r"probe without bindings / no-probe = \d+\.\d+  95 % interval \[\d+\.\d+, \d+\.\d+\]",
        FLOOR,
    ),
    "gpu/digest.py": (r'"v2": \{\s*"verdict": "FAIL"', r'"id": "liveness.hook.firing"'),
    "gpu/overhead.py": (r'OVERHEAD \{.*"tokens_per_s": \d', r'"itl_ms": \d'),
    "gpu/overhead_report.py": (r'"ratio_probe_over_none": \d+\.\d+', r'"noise_floor": \{'),
    "gpu/tokens_ab_gpu.py": (
        r"engine arguments: \{.*\"max_num_seqs\": 256",
        r"batch 256, \d+ steps per phase(.|\n)*A/A floor ±\d+\.\d+ %",
        r"probe / no-probe = \d+\.\d+  95 % interval",
        FLOOR,
    ),
    "gpu/validate.py": (r'deltas: \[\{.*"d_steps_productive": [1-9]', r"policy v2: \d+ rules"),
}


def run_smoke(script: str, cmd: Sequence[str], expect: Sequence[str] | None = None) -> str:
    """Run CMD (SCRIPT's smoke mode); check its exit, its marks, its rows and its numbers
    (EXPECT[SCRIPT] unless EXPECT is given)."""
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
    try:
        rows = stats.parse_rows(text)
    except ValueError as e:
        raise AssertionError(f"{script}: {e}{tail}") from e
    patterns = EXPECT[script] if expect is None else expect
    for pattern in patterns:
        assert re.search(pattern, text), f"{script}: no match for {pattern!r}{tail}"
    if FLOOR in patterns:
        least = 1 if script in BASELINE_NOT_A_ROW else 2
        assert len(rows) >= least, f"{script}: {len(rows)} parsed rows, expected {least}{tail}"
    return text


def test_every_benchmark_has_a_smoke_test() -> None:
    """A new bench/ script without its smoke test (an EXPECT entry) fails here."""
    assert sorted(EXPECT) == smoke.scripts()
    assert set(EXPECT) >= smoke.LIVE


ON_POSTGRES = frozenset({"bindings_ledger.py", "replicas_scale.py"})


@pytest.mark.parametrize("script", sorted(set(EXPECT) - smoke.LIVE - ON_POSTGRES))
def test_smoke(script: str) -> None:
    run_smoke(script, smoke.command(script))


def test_smoke_bindings_ledger(postgres: PostgresServer) -> None:
    """On both backends: the session's PostgreSQL (two fresh databases), not one more."""
    dbs = f"{postgres.createdb('bench_ingest')},{postgres.createdb('bench_query')}"
    run_smoke("bindings_ledger.py", smoke.command("bindings_ledger.py", extra=["--pg-dbs", dbs]))


def test_smoke_replicas_scale(postgres: PostgresServer) -> None:
    """One fresh database per arm on the session's PostgreSQL, not a server of its own."""
    dbs = f"{postgres.createdb('bench_replicas1')},{postgres.createdb('bench_replicas2')}"
    run_smoke("replicas_scale.py", smoke.command("replicas_scale.py", extra=["--pg-dbs", dbs]))


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


# A stand-in benchmark for the harness's negative controls: the smoke machinery of every
# script (_smoke.parse, begin; _stats.interleaved_ns, print_rows) around a measured function.
CONTROL = """
import sys
sys.path.insert(0, {bench!r})
import _smoke
from _stats import interleaved_ns, print_rows


def measured() -> None:
    {body}


_smoke.parse(None)
_smoke.begin("a negative control of the smoke harness")
s = interleaved_ns({{"baseline": lambda: None, "measured": measured}}, rounds=2, number=10)
{report}
"""
GOOD_REPORT = (
    "print_rows(s)\n"
    "ratio = s['measured']['median'] / s['baseline']['median']\n"
    "print(f'  measured / baseline (medians): {ratio:.2f}')"
)
CONTROL_EXPECT = (r"measured / baseline \(medians\): \d+\.\d+", FLOOR)
DEFECTS = {
    # the defect -> (the measured function's body, the report, what the check must say)
    "passes": ("pass", GOOD_REPORT, None),
    "measured function raises": ("raise RuntimeError('an API change')", GOOD_REPORT, "exited 1"),
    "no ratio printed": ("pass", "print_rows(s)", "no match for"),
    "no rows printed": ("pass", GOOD_REPORT.split("\n", 1)[1], "no match for"),
    "unmarked line": ("pass", GOOD_REPORT + "\nsys.__stdout__.write('7.0\\n')", "not marked"),
    "row that does not parse": (
        "pass", GOOD_REPORT + "\nprint('  measured  median nan  min nan  max nan  spread nan%')",
        "does not parse",
    ),
    "one row only": (
        "pass", "print_rows({'measured': s['measured']})\n" + GOOD_REPORT.split("\n", 1)[1],
        "expected 2",
    ),
}  # fmt: skip


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_harness_catches(defect: str, tmp_path: Path) -> None:
    """A benchmark broken in each of these ways fails its smoke test (and a sound one passes:
    the failures come from the defect, not from the stand-in)."""
    body, report, says = DEFECTS[defect]
    script = tmp_path / "control.py"
    script.write_text(CONTROL.format(bench=str(REPO / "bench"), body=body, report=report))
    cmd = [sys.executable, str(script), smoke.FLAG]
    if says is None:
        run_smoke("control.py", cmd, CONTROL_EXPECT)
        return
    with pytest.raises(AssertionError) as caught:
        run_smoke("control.py", cmd, CONTROL_EXPECT)
    assert says in str(caught.value)


def recipe(target: str) -> list[str]:
    """The command lines of the Makefile's TARGET."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def test_make_bench_runs_every_full_benchmark() -> None:
    """A full mode nobody runs rots unseen: `make bench` runs every script in bench/ (bench/gpu's
    run on the device, through the GPU kit)."""
    run = {line.split()[1] for line in recipe("bench") if line.startswith("$(PY) bench/")}
    cpu = {f"bench/{s}" for s in smoke.scripts() if not s.startswith("gpu/")}
    assert sorted(cpu - run) == []


def test_ci_runs_these_tests_and_no_tests_fails() -> None:
    """`.ci/run` runs `make test`, which runs scripts/test.sh: two phases whose marker
    expressions are each other's complement (so every test of this file runs in one of them,
    the live ones with the session's vLLM server), and a phase that selects nothing (pytest's
    exit 5) fails the script."""
    assert "make test" in (REPO / ".ci" / "run").read_text().splitlines()
    assert "scripts/test.sh" in recipe("test")
    script = (REPO / "scripts" / "test.sh").read_text()
    phases = re.findall(r'-m "([^"]+)"', script)
    assert phases == ["not vllm and not docker", "vllm or docker"]
    # exit 5 in one phase: the first runs one test (and passes), the second selects nothing
    out = subprocess.run(
        ["bash", "scripts/test.sh", "-p", "no:cacheprovider", "-n", "0",  # no workers: 3 s less
         "-k", "a_hash_outside_the_history", "tests/test_benchmarks_doc.py"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert (out.returncode, "1 passed" in out.stdout) == (5, True), out.stdout[-2000:]
