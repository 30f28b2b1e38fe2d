"""The README and ``--help`` say the same things, and every make target it names exists."""

from __future__ import annotations

import re

from tests.helpers import REPO, verifier_cli
from verifier.errors import ExitCode, exit_codes_help, exit_codes_table

README = (REPO / "README.md").read_text()


def test_readme_inspect_synopsis_matches_help() -> None:
    out = verifier_cli("inspect", "--help")
    assert out.returncode == 0
    assert "usage: verifier inspect [-h] --pid PID [--tree] [--json]" in out.stdout
    assert "verifier inspect --pid N [--tree] [--json]" in README


def test_readme_exit_codes_table_is_the_exit_code_contract() -> None:
    """The README's "Exit codes" table is exactly ``ExitCode`` rendered (every code, in order,
    with its meaning and the commands that return it)."""
    section = README[README.index("| code | meaning |", README.index("### Exit codes")) :]
    table = section[: section.index("\n\n") + 1]
    assert exit_codes_table() == table


def test_help_epilog_is_the_exit_code_contract() -> None:
    epilog = verifier_cli("--help").stdout
    assert exit_codes_help().strip() in epilog
    assert [int(c) for c in re.findall(r"^  (\d+) +\S", epilog, flags=re.M)] == list(ExitCode)


def test_every_make_target_in_the_readme_exists() -> None:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z]+):", makefile, flags=re.M))
    named = set(re.findall(r"`make ([a-z]+)`", README))
    assert named, "README names no make targets"
    assert named <= targets, named - targets


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in README
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")


def test_readme_synopses_of_the_newer_commands_match_their_help() -> None:
    """Every command the README shows is one the CLI has, with the flags it shows."""
    shown = {
        "window": ["--out", "--timeout"],
        "seal": ["--window", "--results"],
        "exec": ["--results", "--timeout"],
        "sample": ["--pid", "--seconds", "--out"],
        "compare": ["--vs"],
        "diff": [],
        "policy": [],
        "keygen": ["--out"],
    }
    for command, flags in shown.items():
        out = verifier_cli(command, "--help")
        assert out.returncode == 0, (command, out.stderr)
        assert f"verifier {command}" in README, command
        for flag in flags:
            assert flag in out.stdout, (command, flag)
            assert re.search(rf"verifier {command} .*{re.escape(flag)}", README), (command, flag)
