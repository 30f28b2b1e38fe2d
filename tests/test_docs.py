"""The README's gate steps run as written, and the docs say what ``--help`` and the code say.

The README's "Gate your benchmark" blocks are marked ``<!-- gate-step: NAME -->``. The ones
that do not start or stop vLLM are run, in order, in one bash shell against the session's
shared vLLM server (tests/conftest.py); the vLLM start lines are checked, flag by flag, against
the server the tests boot (servewitness/testing/vllm_server.py) and the hooks it declares, so the
two cannot drift apart. Negative controls run the same checks on a broken copy of the README.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from servewitness.errors import ExitCode, exit_codes_help, exit_codes_table
from servewitness.policy import load_policy
from servewitness.testing.vllm_server import DEFAULT_ARGS, VllmServer
from tests import docblocks
from tests.conftest import SERVER_HOOKS
from tests.helpers import REPO, verifier_cli

README = (REPO / "README.md").read_text()
DOCS = sorted(p for p in (REPO / "docs").glob("*.md"))
ALL_DOCS = README + "".join(p.read_text() for p in DOCS)
GATE_HEADING = "## Gate your benchmark"
GATE_STEPS = [
    "settings",
    "vllm-cpu",
    "vllm-gpu",
    "ready",
    "verifier",
    "agent",
    "policy",
    "policy-gpu",
    "exec",
    "wait",
    "check",
    "stop",
    "vllm-stop",
]
# Steps the live test does not paste: they start or stop vLLM (the shared server stands in),
# or are the GPU variants (checked statically below).
NOT_RUN = {"vllm-cpu", "vllm-gpu", "policy-gpu", "vllm-stop"}


def gate_steps(text: str = README) -> dict[str, str]:
    return docblocks.by_name(docblocks.steps(docblocks.section(text, GATE_HEADING), "gate-step"))


# -- static checks of the gate section -------------------------------------------------------


def test_the_gate_section_is_every_step_in_order_and_nothing_unmarked() -> None:
    gate = docblocks.section(README, GATE_HEADING)
    assert [s.name for s in docblocks.steps(gate, "gate-step")] == GATE_STEPS
    assert len(docblocks.fenced_shell_blocks(gate)) == len(GATE_STEPS), "an unmarked block"


def hooks_declared(body: str) -> dict[str, str]:
    """The VERIFIER_HOOKS entries a start block declares: name -> target."""
    (assign,) = [w for w in docblocks.words(body) if w.startswith("VERIFIER_HOOKS=")]
    entries = assign.removeprefix("VERIFIER_HOOKS=").split(",")
    return dict(e.split("=", 1) for e in entries)


def pid_file_problems(body: str) -> list[str]:
    if not re.search(r"^echo \$! > gate/vllm\.pid\b", body, flags=re.M):
        return ["the start block does not keep the API server's pid ($!) in gate/vllm.pid"]
    return []


def cpu_start_problems(body: str) -> list[str]:
    """What in the README's CPU start block differs from how the tests start vLLM."""
    w = docblocks.words(body)
    problems = pid_file_problems(body)
    cmd = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "$MODEL"]
    at = next((i for i in range(len(w)) if w[i : i + len(cmd)] == cmd), None)
    if at is None:
        return [*problems, f"no {' '.join(cmd)!r} in the CPU start block"]
    args = w[at + len(cmd) : w.index(">", at) if ">" in w[at:] else len(w)]
    expected = [*DEFAULT_ARGS, "--host", "127.0.0.1", "--port", "$VLLM_PORT"]
    if args != expected:
        problems.append(f"CPU start flags {args} are not the test server's {expected}")
    for name, target in hooks_declared(body).items():
        if SERVER_HOOKS.get(name) != target:
            problems.append(f"hook {name}={target} is not the shared server's {name}")
    return problems


def test_the_cpu_start_line_is_the_one_the_tests_serve_with() -> None:
    """Flags, entry point and hooks of the README's CPU line are those of the shared server
    the live test runs the other steps against."""
    assert cpu_start_problems(gate_steps()["vllm-cpu"]) == []


def test_negative_control_a_changed_cpu_flag_or_hook_is_caught() -> None:
    broken_flag = README.replace("--dtype float32 ", "")
    assert any("flags" in p for p in cpu_start_problems(gate_steps(broken_flag)["vllm-cpu"]))
    broken_hook = README.replace(
        "v1_step=vllm.v1.worker.gpu_model_runner:", "v1_step=vllm.v1.worker.cpu_model_runner:"
    )
    assert any("hook v1_step" in p for p in cpu_start_problems(gate_steps(broken_hook)["vllm-cpu"]))
    no_pid = README.replace("echo $! > gate/vllm.pid    #", "pgrep -f vllm.entrypoints #")
    assert cpu_start_problems(gate_steps(no_pid)["vllm-cpu"]) != []


def heredoc(body: str) -> str:
    m = re.search(r"<<'EOF'\n(.*?)^EOF$", body, flags=re.M | re.S)
    assert m, "no <<'EOF' heredoc"
    return m[1]


def test_the_gpu_start_line_and_its_policy_agree() -> None:
    """The GPU variant: `vllm serve` with the pid kept from $!, the V2 step hook the shared
    server declares too, and a policy that loads (strong: no unsafe key) and judges exactly
    the hooks the start line declares."""
    steps = gate_steps()
    gpu = steps["vllm-gpu"]
    assert pid_file_problems(gpu) == []
    assert docblocks.words(gpu)[docblocks.words(gpu).index("vllm") + 1] == "serve"
    declared = hooks_declared(gpu)
    assert declared == {"v2_step": SERVER_HOOKS["v2_step"]}
    text = heredoc(steps["policy-gpu"])
    load_policy(text)  # raises on an error or an unsafe (weak) policy
    assert {h["name"] for h in tomllib.loads(text)["hooks"]} == set(declared)
    assert "gate/policy.toml" in steps["policy-gpu"].split("EOF")[-1]


def test_the_cpu_policy_judges_the_hooks_the_cpu_line_declares() -> None:
    steps = gate_steps()
    (src,) = re.findall(r"cp (examples/policies/\S+\.toml) gate/policy.toml", steps["policy"])
    text = (REPO / src).read_text()
    load_policy(text)
    assert {h["name"] for h in tomllib.loads(text)["hooks"]} == set(
        hooks_declared(steps["vllm-cpu"])
    )


def test_the_vllm_stop_step_stops_the_server_the_pid_file_names() -> None:
    assert docblocks.words(gate_steps()["vllm-stop"]) == ["kill", "$(cat gate/vllm.pid)"]


# -- the gate steps, run for real ------------------------------------------------------------


def gate_script(text: str, server: VllmServer) -> str:
    """The README's gate steps as one bash script, the shared SERVER standing in for the vLLM
    start: after the settings, MODEL and VLLM_PORT are the shared server's and gate/vllm.pid
    holds its pid. Each step is announced on stderr (``gate-step NAME``)."""
    steps = gate_steps(text)
    out = ["set -euo pipefail"]
    for name, body in steps.items():
        if name in NOT_RUN:
            continue
        out += [f"echo 'gate-step {name}' >&2", body]
        if name == "settings":
            out += [
                '[ "$MODEL" ] && [ "$VLLM_PORT" ] && [ -d gate ]',
                f"export MODEL={server.model} VLLM_PORT={server.port}",
                f"echo {server.pid} > gate/vllm.pid",
            ]
    return "\n".join(out) + "\n"


def stop_started(cwd: Path) -> None:
    """Stop the verifier and agent the steps started (the pid files they wrote, and only while
    that pid still runs `verifier`): SIGTERM, as the README's stop step sends (an agent in the
    middle of its first collect can take tens of seconds on a loaded machine), then SIGKILL."""
    for name in ("agent.pid", "verifier.pid"):
        try:
            pid = int((cwd / "gate" / name).read_text())
        except (OSError, ValueError):
            continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _runs_verifier(pid):
                break
            os.kill(pid, sig)
            deadline = time.monotonic() + 120
            while _runs_verifier(pid) and time.monotonic() < deadline:
                time.sleep(0.2)


def _runs_verifier(pid: int) -> bool:
    """PID is a live (not zombie) process whose command line names `verifier`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return b"verifier" in cmdline and state != "Z"


def run_gate(
    text: str, server: VllmServer, cwd: Path
) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run the gate steps of TEXT in CWD (with .venv and examples/ linked in, as at the
    repository root); returns the result and the last step that began."""
    (cwd / ".venv").symlink_to(sys.prefix)
    (cwd / "examples").symlink_to(REPO / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIFIER_")}
    env["VERIFIER_STATE_DIR"] = str(cwd / "state")
    try:
        out = subprocess.run(
            ["bash", "-c", gate_script(text, server)],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        stop_started(cwd)
    begun = re.findall(r"^gate-step (\S+)$", out.stderr, flags=re.M)
    return out, begun[-1] if begun else ""


@pytest.mark.vllm
def test_the_readme_gate_steps_run_as_written(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Pasted in order against a real vLLM server: the verifier and agent start, the run
    registers, `verifier exec` opens a window, runs `vllm bench serve`'s code and seals it
    HELD; the seal verifies offline against the results; wait and status say PASS; stop stops
    both daemons."""
    out, last = run_gate(README, vllm_server, tmp_path)
    log = f"{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    assert (out.returncode, last) == (0, "stop"), log
    results = json.loads((tmp_path / "gate" / "results.json").read_text())
    assert results["completed"] == results["num_prompts"] == 20, results
    seal = json.loads((tmp_path / "gate" / "results.json.seal.json").read_text())
    assert seal, "empty seal"
    assert "gate open" in out.stdout, log  # `verifier wait` exited 0


@pytest.mark.vllm
def test_negative_control_a_broken_readme_step_fails_the_run(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """The same runner on a copy of the README whose register step names a policy file that
    does not exist: the script stops at that step with the CLI's exit code for a configuration
    error (3), and the daemons it started are stopped."""
    step = "verifier run register bench-1 --policy gate/policy.toml"
    broken = README.replace(step, step.replace("policy.toml", "nope.toml"), 1)
    assert broken != README
    out, last = run_gate(broken, vllm_server, tmp_path)
    assert (out.returncode, last) == (ExitCode.CONFIG, "policy"), out.stderr[-3000:]
    assert "nope.toml" in out.stderr


# -- links and words -------------------------------------------------------------------------


def test_every_doc_is_in_the_index_and_every_relative_link_resolves() -> None:
    index = (REPO / "docs" / "README.md").read_text()
    unlisted = [p.name for p in DOCS if p.name != "README.md" and f"]({p.name})" not in index]
    assert unlisted == []
    broken = []
    for doc in [REPO / "README.md", *DOCS]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not re.match(r"[a-z]+://", target) and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []


def test_user_docs_name_no_internal_tracker_issues_and_no_kit_outside_the_repo() -> None:
    for doc in [REPO / "README.md", *DOCS]:
        text = doc.read_text()
        assert not re.findall(r"\bissues? \d+", text, flags=re.I), doc.name
        assert "../shared" not in text, doc.name


def test_the_gpu_scripts_and_docs_need_nothing_from_outside_the_repo() -> None:
    """The GPU kit is tracked (bench/gpu/kit/): every kit file the GPU docs and bench/gpu's
    scripts name exists there, and none of them loads its client from the ignored .gpu/ folder
    (which only prepare.sh fills) or from a kit beside the checkout."""
    texts = {p: p.read_text() for p in [REPO / "docs" / "gpu-validation.md",
                                        *(REPO / "bench" / "gpu").glob("*.py")]}  # fmt: skip
    named = {m for t in texts.values() for m in re.findall(r"bench/gpu/kit/[\w.-]+", t)}
    assert "bench/gpu/kit/client.py" in named
    assert [n for n in named if not (REPO / n).is_file()] == []
    for path, text in texts.items():
        assert ".gpu/call2/client.py" not in text and "../shared" not in text, path.name
    for kit in ("prepare.sh", "stage.sh", "serve.sh", "client.py", "build_model.py"):
        assert (REPO / "bench" / "gpu" / "kit" / kit).is_file(), kit


def test_negative_control_the_words_check_sees_a_tracker_number() -> None:
    assert re.findall(r"\bissues? \d+", "as issue 7 said", flags=re.I)


# -- --help and the docs ---------------------------------------------------------------------


def test_inspect_synopsis_matches_help() -> None:
    out = verifier_cli("inspect", "--help")
    assert out.returncode == 0
    assert "usage: verifier inspect [-h] --pid PID [--tree] [--json]" in out.stdout
    assert "verifier inspect --pid N [--tree] [--json]" in (REPO / "docs/inspect.md").read_text()


def test_exit_codes_table_is_the_exit_code_contract() -> None:
    """docs/gate.md's "Exit codes" table is exactly ``ExitCode`` rendered (every code, in
    order, with its meaning and the commands that return it)."""
    gate = (REPO / "docs" / "gate.md").read_text()
    section = gate[gate.index("| code | meaning |", gate.index("## Exit codes")) :]
    table = section[: section.index("\n\n") + 1]
    assert exit_codes_table() == table


def test_help_epilog_is_the_exit_code_contract() -> None:
    epilog = verifier_cli("--help").stdout
    assert exit_codes_help().strip() in epilog
    assert [int(c) for c in re.findall(r"^  (\d+) +\S", epilog, flags=re.M)] == list(ExitCode)


def test_every_make_target_the_docs_name_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z-]+):", makefile, flags=re.M))
    named = set(re.findall(r"`make ([a-z-]+)`", ALL_DOCS))
    assert {"demo", "test"} <= set(re.findall(r"`make ([a-z-]+)`", README))
    assert named <= targets, named - targets


def test_ci_runs_the_readme_test_command() -> None:
    assert re.search(r"^make test +#", README, flags=re.M)
    assert re.search(r"^make demo +#", README, flags=re.M)
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")


def test_synopses_of_the_commands_match_their_help() -> None:
    """Every command the docs show is one the CLI has, with the flags they show."""
    shown = {
        "serve": ["--listen", "--db"],
        "agent": ["--target", "--pid", "--spool"],
        "window": ["--out", "--timeout"],
        "seal": ["--window", "--results"],
        "exec": ["--results", "--timeout"],
        "wait": ["--timeout"],
        "sample": ["--pid", "--seconds", "--out"],
        "compare": ["--vs"],
        "diff": [],
        "policy": [],
        "keygen": ["--out"],
    }
    for command, flags in shown.items():
        out = verifier_cli(command, "--help")
        assert out.returncode == 0, (command, out.stderr)
        assert f"verifier {command}" in ALL_DOCS, command
        for flag in flags:
            assert flag in out.stdout, (command, flag)
            assert re.search(rf"verifier {command} .*{re.escape(flag)}", ALL_DOCS), (command, flag)
    audit = verifier_cli("audit", "verify-seal", "--help").stdout
    assert "--key" in audit and "--results" in audit
