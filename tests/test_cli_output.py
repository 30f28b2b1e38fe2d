"""Output hygiene of the ``verifier`` CLI (issue 22): what a person at a terminal, a script and
a pipe get from it.

Every test runs the real CLI in a subprocess against a real verifier (a daemon on a Unix
socket) and, where evidence is needed, a real probed Python process reported by a real agent
(the fake worker of test_faults: the probe, its step counting and a hook on a runner class
defined in a file, no vLLM). Terminals are real pseudo-terminals (``pty.openpty``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servewitness._cli import globalopts, verdict_text
from servewitness._cli.main import build_parser
from servewitness.model import Finding, RunVerdict, Severity, TargetVerdict, Verdict
from tests.helpers import REPO, state_dir, verifier_cli
from tests.test_faults import CHILD, RUNNER, policy, serve
from tests.test_gate_e2e import CLI, Daemon

# a file in a directory named like this tool's package, that no distribution claims: what a
# copy of the probe planted beside the installed one looks like (never folded into "self")
PLANTED = "probe/servewitness_probe/planted.py"


@dataclass
class Served:
    addr: str
    dir: Path
    worker_pid: int


def _worker_env(probe_dir: Path, mods: Path) -> dict[str, str]:
    """The fake worker's environment: its modules, and this tool's package from its install
    (not this checkout on PYTHONPATH), so its own files are what an install loads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIFIER_")}
    env.update(
        PYTHONPATH=str(mods),
        VERIFIER_PROBE_DIR=str(probe_dir),
        VERIFIER_PROBE_BINDINGS="0",
        VERIFIER_HOOKS="h=fakerunner:Runner.execute_model",
    )
    return env


PLANT = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("planted", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A verifier, a probed fake worker that also loaded a planted file, its agent, and run
    ``r`` (PASS once the agent reported) plus run ``p`` (a target that never reports:
    PENDING)."""
    d = tmp_path_factory.mktemp("out")
    mods = d / "mods"
    mods.mkdir()
    (mods / "fakerunner.py").write_text(RUNNER)
    planted = d / "elsewhere" / PLANTED
    planted.parent.mkdir(parents=True)
    planted.write_text("X = 1\n")
    code = CHILD.replace("import fakerunner\n", "import fakerunner\n" + PLANT)
    assert code != CHILD
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(planted)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_worker_env(d / "probe", mods),
        cwd=mods,  # not this checkout: `python -c` puts the working directory on sys.path
    )
    addr = f"unix:{d}/v.sock"
    daemons: list[Daemon] = []
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert state_dir(d / "probe", proc.pid).is_dir()
        daemons.append(serve(d, str(d / "db.sqlite3"), addr))
        daemons.append(
            Daemon(
                [
                    "agent",
                    "--verifier",
                    addr,
                    "--target",
                    "t",
                    "--pid",
                    str(proc.pid),
                    "--interval",
                    "0.2",
                    "--spool",
                    str(d / "spool"),
                    "--no-docker",
                ],
                d / "agent.log",
            ).start()
        )
        (d / "r.toml").write_text(policy())
        pending = policy().replace("version = 1\n", 'version = 1\n[targets]\nnames = ["none"]\n')
        (d / "p.toml").write_text(pending)
        for run in ("r", "p"):
            reg = verifier_cli(
                "run", "register", run, "--policy", str(d / f"{run}.toml"), "--verifier", addr
            )
            assert reg.returncode == 0, reg.stderr
        waited = verifier_cli("wait", "r", "--timeout", "60", "--verifier", addr)
        assert waited.returncode == 0, (waited.stdout, waited.stderr, (d / "agent.log").read_text())
        yield Served(addr, d, proc.pid)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
        proc.communicate(timeout=10)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, check=False)


def log_lines(stderr: str) -> list[dict[str, object]]:
    """The JSON log lines of a CLI whose stderr is not a terminal; a non-JSON line fails."""
    return [json.loads(ln) for ln in stderr.splitlines() if ln.strip()]


# 1. this tool's own files: one "self" line ------------------------------------------------
def test_status_folds_this_tools_own_files_and_lists_every_other(served: Served) -> None:
    """``status`` shows the probe's files (and the install's .pth files) as one "self" line
    per process; -v and --json list every one; a planted file under a directory named like
    the package is listed on its own line, never folded."""
    short = run_cli("status", "r", "--verifier", served.addr)
    full = run_cli("status", "r", "-v", "--verifier", served.addr)
    as_json = run_cli("status", "r", "--json", "--verifier", served.addr)
    assert (short.returncode, full.returncode, as_json.returncode) == (0, 0, 0), short.stderr
    (origins,) = [
        f
        for t in json.loads(as_json.stdout)["runs"][0]["targets"]
        for f in t["findings"]
        if f["id"] == "provenance.origins"
    ]
    files = origins["context"]["files"]
    probe = [f["path"] for f in files if "/probe/servewitness_probe/" in f["path"]]
    own = [f for f in files if f["origin"] == "editable"]
    assert any(p.endswith("/probe/servewitness_probe/_core.py") for p in probe), probe
    planted = [f for f in files if f["path"].endswith(PLANTED)]
    assert len(planted) == 1 and planted[0]["origin"] not in {"editable", "pristine"}, planted
    for f in files:  # -v: every file, as before
        assert f["path"] in full.stdout, f["path"]
    for f in own:
        assert f["path"] not in short.stdout, f["path"]
    (self_line,) = [ln for ln in short.stdout.splitlines() if ln.strip().startswith("self ")]
    assert f"{len(own)} files of this tool" in self_line, self_line
    assert re.search(r"digest [0-9a-f]{16}", self_line), self_line
    assert planted[0]["path"] in short.stdout  # the negative control: a planted copy shows
    assert len(short.stdout.splitlines()) < len(full.stdout.splitlines())


def test_wait_pass_is_a_few_lines_and_verbose_or_json_give_the_rest(served: Served) -> None:
    """On PASS ``wait`` prints the verdict, the target and its hook (INFO findings counted,
    not printed); -v prints every finding and file; --json the verdict as JSON; -q nothing."""
    brief = run_cli("wait", "r", "--timeout", "30", "--verifier", served.addr)
    full = run_cli("wait", "r", "--timeout", "30", "-v", "--verifier", served.addr)
    as_json = run_cli("--json", "wait", "r", "--timeout", "30", "--verifier", served.addr)
    quiet = run_cli("wait", "r", "--timeout", "30", "-q", "--verifier", served.addr)
    assert [x.returncode for x in (brief, full, as_json, quiet)] == [0, 0, 0, 0], brief.stderr
    lines = brief.stdout.splitlines()
    assert lines[0].startswith("run r: PASS"), brief.stdout
    assert "  target t: PASS" in lines
    assert any(ln.startswith("    hook h (worker rank 0, pid ") for ln in lines), lines
    assert re.fullmatch(r"  \(\d+ info findings: -v or --json shows them\)", lines[-1]), lines
    assert len(lines) <= 6, brief.stdout
    assert "provenance.origins" in full.stdout and len(full.stdout.splitlines()) > 10
    assert json.loads(as_json.stdout)["verdict"] == "PASS"
    assert quiet.stdout == ""


def test_inspect_fits_100_columns_and_prints_no_python_reprs(served: Served) -> None:
    """Every line of ``inspect`` but the ones naming a path fits 100 columns; nothing prints
    a dict or list repr; the probe's files are one "self" line unless -v."""
    out = run_cli("inspect", "--pid", str(served.worker_pid))
    full = run_cli("inspect", "--pid", str(served.worker_pid), "-v")
    assert out.returncode == 0 and full.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(ln.startswith("  hook ") and "productive" in ln for ln in lines), out.stdout
    wide = [ln for ln in lines if len(ln) > 100 and "/" not in ln]
    assert wide == [], wide
    reprs = [ln for ln in lines if re.search(r"\{'|\['|': ", ln)]
    assert reprs == [], reprs
    assert "    self " in out.stdout and "/probe/servewitness_probe/_core.py" not in out.stdout
    assert "/probe/servewitness_probe/_core.py" in full.stdout


def test_on_a_terminal_every_command_s_text_fits_100_columns(served: Served) -> None:
    """``status`` (-v too), ``run list``, ``target list``, ``audit run`` and ``compare`` with
    stdout on a terminal: every line fits 100 columns but a single word longer (a path is
    never cut), and nothing prints a Python repr. On a pipe the same text keeps each line
    whole (grep finds a message on one line): the control that the terminal's text was
    wrapped, not short already."""
    db = str(served.dir / "db.sqlite3")
    samples = []
    for i, tps in enumerate((100.0, 101.0, 99.0, 97.0, 98.0, 96.5)):
        f = served.dir / f"sample-{i}.json"
        values = {"tokens_per_s": tps, "tokens_per_step": 4.0, "decode_tokens_per_s": tps / 2}
        f.write_text(json.dumps({"sample": 1, "boot": f"b/{i}/1", "label": "x", **values}))
        samples.append(str(f))
    commands = [
        ("status", "--verifier", served.addr),
        ("status", "r", "-v", "--verifier", served.addr),
        ("run", "list", "--verifier", served.addr),
        ("target", "list", "--verifier", served.addr),
        ("audit", "run", "r", "--db", db),
        ("compare", *samples[:3], "--vs", *samples[3:]),
    ]
    for args in commands:
        code, text = _stdout_on_a_terminal(*CLI, *args)
        lines = text.replace("\r\n", "\n").splitlines()
        assert code in (0, 1) and lines, (args, text)
        wide = [ln for ln in lines if len(ln) > 100 and len(ln.split()) > 1]
        assert wide == [], (args, wide)
        reprs = [ln for ln in lines if re.search(r"\{'|\['|': ", ln)]
        assert reprs == [], (args, reprs)
    piped = run_cli("status", "--verifier", served.addr).stdout.splitlines()
    assert [ln for ln in piped if len(ln) > 100 and len(ln.split()) > 1], piped


def _stdout_on_a_terminal(*args: str) -> tuple[int, str]:
    """ARGS with stdout a pseudo-terminal of 200 columns: exit code, what it received."""
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(args, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    seen = _drain(master, proc, 60)
    return proc.wait(timeout=30), seen


def _drain(master: int, proc: subprocess.Popen[Any], limit: float) -> str:
    """What PROC wrote to the pseudo-terminal MASTER (closed here) until it closed its end or
    exited, or LIMIT seconds passed."""
    seen = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return seen.decode(errors="replace")


# 2. -q and --json; empty lists -------------------------------------------------------------
def test_run_list_and_target_list_json_and_their_empty_forms(tmp_path: Path) -> None:
    """On a verifier with no runs and no targets, ``run list`` and ``target list`` say so;
    --json gives an object with an empty list."""
    d = serve(tmp_path, str(tmp_path / "db.sqlite3"), f"unix:{tmp_path}/v.sock")
    addr = f"unix:{tmp_path}/v.sock"
    try:
        runs = run_cli("run", "list", "--verifier", addr)
        runs_json = run_cli("run", "list", "--json", "--verifier", addr)
        targets = run_cli("target", "list", "--verifier", addr)
        targets_json = run_cli("--json", "target", "list", "--verifier", addr)
    finally:
        d.stop()
    assert (runs.returncode, runs.stdout) == (0, "no runs registered\n"), runs.stderr
    assert json.loads(runs_json.stdout) == {"runs": []}
    assert (targets.returncode, targets.stdout) == (0, "no targets reported\n"), targets.stderr
    assert json.loads(targets_json.stdout) == {"targets": []}


def test_run_list_json_names_each_run_with_its_verdict(served: Served) -> None:
    listed = run_cli("run", "list", "--json", "--verifier", served.addr)
    runs = {r["name"]: r["verdict"] for r in json.loads(listed.stdout)["runs"]}
    assert runs == {"r": "PASS", "p": "PENDING"}, listed.stdout
    targets = json.loads(run_cli("target", "list", "--json", "--verifier", served.addr).stdout)
    assert [t["target"] for t in targets["targets"]] == ["t"]


# 3. global options anywhere ----------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["-q", "status", "r"],
        ["status", "r", "-q"],
        ["status", "-q", "r"],
        ["--quiet", "status", "r"],
    ],
)
def test_quiet_before_or_after_the_subcommand_prints_nothing(
    served: Served, args: list[str]
) -> None:
    out = run_cli(*args, "--verifier", served.addr)
    assert (out.returncode, out.stdout) == (0, ""), out.stderr


def test_verbose_json_and_verifier_before_or_after_the_subcommand(served: Served) -> None:
    before = run_cli("-v", "--verifier", served.addr, "status", "r")
    after = run_cli("status", "r", "-v", "--verifier", served.addr)
    assert before.returncode == 0 and before.stdout == after.stdout, before.stderr
    js = run_cli("--json", "--verifier", served.addr, "status", "r")
    assert json.loads(js.stdout)["runs"][0]["verdict"] == "PASS"


def test_a_global_option_the_command_cannot_honour_is_a_usage_error() -> None:
    """--json before a command with no JSON form, -q with -v: exit 2, a usage line."""
    no_json = run_cli("--json", "completion", "bash")
    assert no_json.returncode == 2 and "has no JSON output" in no_json.stderr, no_json.stderr
    both = run_cli("-q", "-v", "run", "list")
    assert both.returncode == 2 and "-q/--quiet and -v/--verbose" in both.stderr, both.stderr


# 4. SIGPIPE --------------------------------------------------------------------------------
def _closed_reader(*args: str) -> subprocess.CompletedProcess[str]:
    """ARGS run with stdout a pipe whose reader is already gone: the first write fails."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120, check=False
        )
    finally:
        os.close(w)
    return proc


def test_a_closed_pipe_ends_the_cli_quietly(served: Served) -> None:
    """``inspect --json``, ``status`` and ``audit verify`` writing to a pipe whose reader left
    exit 141 (as a command killed by SIGPIPE) with no traceback. The negative control: a
    Python program that does not handle it prints a BrokenPipeError traceback here."""
    control = _closed_reader(sys.executable, "-c", "print('x' * 100000)")
    assert "BrokenPipeError" in control.stderr  # the setup does break the pipe
    for args in (
        ["inspect", "--pid", str(served.worker_pid), "--json"],
        ["status", "--verifier", served.addr],
        ["audit", "verify", "--db", str(served.dir / "db.sqlite3")],
    ):
        out = _closed_reader(*CLI, *args)
        assert out.returncode == 141, (args, out.stderr)
        assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


def test_inspect_json_into_head_exits_quietly(served: Served) -> None:
    """The issue's own pipeline: ``verifier inspect --pid N --json | head -1``."""
    cmd = " ".join([*CLI, "inspect", "--pid", str(served.worker_pid), "--tree", "--json"])
    out = subprocess.run(
        ["bash", "-c", f"{cmd} | head -1"], capture_output=True, text=True, timeout=120, check=False
    )
    assert (out.returncode, out.stdout) == (0, "{\n"), out.stderr
    assert "Traceback" not in out.stderr, out.stderr


# 5. one INSECURE warning, through the logger -----------------------------------------------
def test_the_insecure_warning_is_one_json_log_line(served: Served) -> None:
    """With stderr not a terminal (JSON logs), an insecure client's warning is one JSON log
    line at level warning; no plain text line among the logs."""
    out = run_cli("wait", "r", "--timeout", "30", "--verifier", served.addr)
    logs = log_lines(out.stderr)  # every stderr line parses as JSON
    warnings = [x for x in logs if "INSECURE mode" in str(x.get("event"))]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning", out.stderr


def test_the_insecure_warning_is_given_once_per_process() -> None:
    """Many insecure connections in one process: one warning (a fresh interpreter, with the
    CLI's logging configured, opens three channels)."""
    code = (
        "from servewitness import _logging\n_logging.configure()\n"
        "from servewitness.security.tls import client_channel\n"
        "for a in ('unix:/nonexistent/a', 'unix:/nonexistent/b', 'localhost:1'):\n"
        "    client_channel(a, None, []).close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert [x["event"] for x in log_lines(out.stderr)] == [
        "INSECURE mode: connecting to unix:/nonexistent/a without TLS or authentication"
    ]


# 6. wait's progress line -------------------------------------------------------------------
def _on_a_terminal(*args: str, limit: float = 60) -> tuple[int, str, str]:
    """ARGS with stderr a pseudo-terminal (stdout a pipe): exit code, stdout, what the
    terminal received."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = _drain(master, proc, limit)
    out, _ = proc.communicate(timeout=30)
    return proc.returncode, out, seen


def test_wait_progress_line_on_a_terminal_then_the_error_on_its_own_line(
    served: Served,
) -> None:
    """On a terminal ``wait`` redraws one line with elapsed time, --timeout, the verdict and
    its reason; the timeout error starts a line of its own."""
    code, out, tty = _on_a_terminal(*CLI, "wait", "p", "--timeout", "3", "--verifier", served.addr)
    assert code == 5, tty
    assert out == ""
    drawn = [x for x in tty.replace("\r\n", "\n").split("\r") if x.strip()]
    assert any(re.match(r"p: \d+s of 3s  PENDING: \d+ selected target", x) for x in drawn), drawn
    assert re.search(
        r"\n(?:[^\n]*\bwarning\b[^\n]*\n)*verifier: error: ", tty.replace("\r\n", "\n")
    ), tty
    assert "   verifier: error" not in tty  # not glued onto the progress line


def test_wait_on_a_pipe_draws_no_progress(served: Served) -> None:
    out = run_cli("wait", "p", "--timeout", "2", "--verifier", served.addr)
    assert out.returncode == 5 and "\r" not in out.stderr, out.stderr
    assert "still PENDING" in out.stderr


# 8. shell completion -----------------------------------------------------------------------
def _complete(script: Path, line: str) -> list[str]:
    """What bash completes for LINE (the cursor at its end) with SCRIPT sourced."""
    probe = (
        f'source {script}\ncomplete -p verifier\nread -ra COMP_WORDS <<<"$LINE"\n'
        '[[ "$LINE" == *" " ]] && COMP_WORDS+=("")\nCOMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n'
        '_verifier_complete\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", probe],
        capture_output=True,
        text=True,
        env={**os.environ, "LINE": line},
        timeout=30,
        check=True,
    )
    first, *rest = out.stdout.splitlines()
    assert first == "complete -F _verifier_complete verifier", first
    return rest


def test_bash_completion_completes_subcommands_and_their_options(tmp_path: Path) -> None:
    script = tmp_path / "verifier.bash"
    out = run_cli("completion", "bash")
    assert out.returncode == 0, out.stderr
    script.write_text(out.stdout)
    assert _complete(script, "verifier sta") == ["status"]
    assert set(_complete(script, "verifier run ")) >= {"register", "list"}
    assert "--json" in _complete(script, "verifier -v run list --")
    assert _complete(script, "verifier wait r --tim") == ["--timeout"]
    assert _complete(script, "verifier audit verify-s") == ["verify-seal"]
    quiet = run_cli("-q", "completion", "bash")  # -q never silences what a command is for
    assert quiet.stdout == out.stdout
    zsh = run_cli("completion", "zsh")
    assert zsh.returncode == 0 and "bashcompinit" in zsh.stdout
    assert run_cli("completion", "fish").returncode == 2


# 9. every option has help ------------------------------------------------------------------
def _walk(
    parser: argparse.ArgumentParser, path: str = "verifier"
) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")
        else:
            yield path, action


def test_every_option_and_argument_has_help_text() -> None:
    """Walks the whole argparse tree: an option or positional without help (or one hidden
    with SUPPRESS, which tests only use) is listed."""
    missing = [
        f"{path} {'/'.join(a.option_strings) or a.dest}"
        for path, a in _walk(build_parser())
        if not a.help and not isinstance(a, argparse._HelpAction)
    ]
    assert missing == []


def test_the_help_walk_catches_an_option_without_help() -> None:
    """The negative control: the same walk over a parser with one bare option finds it."""
    p = build_parser()
    p.add_argument("--bare")
    missing = [a.dest for _, a in _walk(p) if not a.help]
    assert missing == ["bare"]


def test_sigpipe_is_not_reset_to_default() -> None:
    """The CLI handles a closed pipe itself: SIGPIPE stays ignored (Python's default), so a
    gRPC or database socket write is an error it can report, never a silent kill."""
    code = "import signal, servewitness._cli.main\nprint(signal.getsignal(signal.SIGPIPE))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=REPO,
    )
    assert out.stdout.strip() == str(signal.SIG_IGN)


# repeated findings -------------------------------------------------------------------------
def _verdict() -> RunVerdict:
    """Three processes with the same WARNING and the same ERROR (as the policy words them)."""
    procs = [("api_server", None, 10), ("engine_core", None, 11), ("worker", 0, 12)]
    findings = []
    for role, rank, pid in procs:
        who = f"{role}{'' if rank is None else f' rank {rank}'} (pid {pid})"
        ctx = {"pid": pid, "role": role, "rank": rank}
        findings.append(Finding("x.loader", Severity.WARNING, f"{who}: a loader", "t", ctx))
        findings.append(Finding("x.bad", Severity.ERROR, f"{who}: a bad file", "t", ctx))
    target = TargetVerdict("t", Verdict.FAIL, tuple(findings), 0.0, 0.0)
    return RunVerdict("r", "sha256:" + "0" * 64, Verdict.FAIL, (target,), (), 0.0)


def test_a_warning_said_of_several_processes_is_one_line_an_error_never_folds() -> None:
    brief = verdict_text.render(_verdict(), verdict_text.BRIEF).splitlines()
    full = verdict_text.render(_verdict(), verdict_text.FULL).splitlines()
    assert [ln for ln in brief if "x.loader" in ln] == [
        "    warning x.loader: in 3 processes (api_server (pid 10), engine_core (pid 11), "
        "worker rank 0 (pid 12)): a loader"
    ]
    assert len([ln for ln in brief if "x.bad" in ln]) == 3  # each ERROR on its own line
    assert len([ln for ln in full if "x.loader" in ln]) == 3  # -v: as the verifier said it
    assert brief[0] == "run r: FAIL  (policy sha256:000000000000)"


def test_window_and_seal_print_json_when_asked(served: Served) -> None:
    """``window --json`` prints the opened window (its id as saved in --out); ``seal --json``
    whether the window held, the seal's path and its content (with the findings that broke
    it), and nothing else on stdout."""
    saved, results = served.dir / "w.json", served.dir / "results.txt"
    results.write_text("tokens/s 1\n")
    opened = run_cli("window", "r", "--out", str(saved), "--timeout", "60", "--json",
                     "--verifier", served.addr)  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    window = json.loads(opened.stdout)
    assert window["run"] == "r" and window["file"] == str(saved)
    assert window["window_id"] in saved.read_text()
    sealed = run_cli("seal", "r", "--window", str(saved), "--results", str(results), "--json",
                     "--verifier", served.addr)  # fmt: skip
    seal = json.loads(sealed.stdout)
    # no step ran in the window (the fake worker stepped before it): not held, exit 1
    assert (sealed.returncode, seal["held"]) == (1, False), sealed.stdout
    assert Path(seal["seal"]).is_file()
    assert [f["id"] for f in seal["content"]["findings"]] == ["window.no_steps"]
    assert seal["content"]["results"]["sha256"] == hashlib.sha256(results.read_bytes()).hexdigest()


# Leaves without --json, and why: their output is the product itself (a file's text), or they
# print no result. Every other command prints one, and has a JSON form of it.
NO_JSON = {
    "verifier policy init": "prints the policy it writes (TOML)",
    "verifier policy schema": "prints the JSON Schema itself",
    "verifier serve": "a daemon: logs, no result",
    "verifier agent": "a daemon: logs, no result",
    "verifier completion": "prints a shell script",
}


def test_every_command_that_prints_a_result_has_json() -> None:
    """Walk the CLI's commands: each has --json, or is listed in NO_JSON with the reason; a
    command listed there that gained --json is taken off (the list stays true)."""
    leaves = {leaf.prog: leaf for leaf in globalopts.leaves(build_parser())}
    assert set(NO_JSON) <= set(leaves), set(NO_JSON) - set(leaves)
    has = {prog for prog, leaf in leaves.items() if "--json" in leaf._option_string_actions}
    assert sorted(set(leaves) - has - set(NO_JSON)) == []
    assert sorted(has & set(NO_JSON)) == []


def test_policy_check_and_certs_print_json_when_asked(tmp_path: Path) -> None:
    """The local commands' JSON forms carry what their text says, and nothing else on
    stdout."""
    (tmp_path / "p.toml").write_text(policy())
    text = run_cli("policy", "check", str(tmp_path / "p.toml"))
    doc = json.loads(run_cli("policy", "check", str(tmp_path / "p.toml"), "--json").stdout)
    assert text.returncode == 0 and doc["file"] == str(tmp_path / "p.toml")
    assert doc["digest"] in text.stdout and doc["weakest_point"] in text.stdout
    assert doc["rules"] and all(f"  {r}" in text.stdout for r in doc["rules"])
    d = tmp_path / "pki"
    ca = json.loads(run_cli("certs", "init", "--dir", str(d), "--json").stdout)
    assert ca == {"cert": str(d / "ca.pem"), "key": str(d / "ca.key")}
    issued = run_cli("--json", "certs", "issue", "ops", "--dir", str(d), "--role", "operator")
    assert json.loads(issued.stdout)["cert"] == str(d / "ops.pem"), issued.stderr
    made = run_cli("certs", "token", "--name", "n", "--role", "auditor", "--json")
    token = json.loads(made.stdout)
    assert token["token"].startswith("vt_") and len(token["sha256"]) == 64
    assert (token["name"], token["role"], token["targets"]) == ("n", "auditor", [])


def test_run_register_and_exec_print_json_when_asked(served: Served) -> None:
    """``run register --json``: the run and its policy digest. ``exec --json``: the harness's
    own output, then the outcome as the last line (the window notice on stderr), the seal
    written where it says."""
    (served.dir / "j.toml").write_text(policy())
    reg = run_cli("run", "register", "j", "--policy", str(served.dir / "j.toml"), "--json",
                  "--verifier", served.addr)  # fmt: skip
    assert reg.returncode == 0, reg.stderr
    assert json.loads(reg.stdout)["run"] == "j" and len(json.loads(reg.stdout)) == 2
    results = served.dir / "exec-results.txt"
    harness = f"print('harness says hi'); open({str(results)!r}, 'w').write('tokens/s 1')"
    ran = run_cli("exec", "r", "--results", str(results), "--timeout", "60", "--json",
                  "--verifier", served.addr, "--", sys.executable, "-c", harness)  # fmt: skip
    *before, last = ran.stdout.splitlines()
    assert before == ["harness says hi"], ran.stdout
    outcome = json.loads(last)
    assert (outcome["run"], outcome["exit_code"], outcome["results_written"]) == ("r", 0, True)
    assert Path(outcome["seal"]).is_file() and "window" in ran.stderr
    # the fake worker steps only before the window: not held, exit 1 (as seal --json)
    assert (ran.returncode, outcome["held"]) == (1, False), ran.stderr


def test_verbose_counts_wherever_it_is_given() -> None:
    """``-v status -v`` is ``-vv`` (argparse alone would keep only the subcommand's count)."""
    parser = build_parser()
    for argv, expected in ((["-v", "status", "-v"], 2), (["status", "-vv"], 2), (["status"], 0)):
        args = parser.parse_args(argv)
        globalopts.resolve(parser, args)
        assert (argv, args.verbose) == (argv, expected)
