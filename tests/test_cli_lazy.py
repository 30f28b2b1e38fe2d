"""A command line that names its subcommand builds that subcommand's parser alone
(``servewitness._cli.main.COMMANDS``): the same parser, the same help, fewer imports.

The parsers compared are the real ones; the import check runs the real console entry point in a
fresh interpreter (a test process has imported every module already).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from servewitness._cli import globalopts
from servewitness._cli.main import COMMANDS, build_parser, command_of
from tests.helpers import REPO


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _helps(parser: argparse.ArgumentParser, path: str) -> dict[str, str]:
    """Every parser's help text under PARSER (subcommands of subcommands included), by path."""
    out = {path: parser.format_help()}
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for name, child in action.choices.items():
            out |= _helps(child, f"{path} {name}")
    return out


def test_the_table_names_every_subcommand_and_the_module_that_adds_it() -> None:
    """COMMANDS is the full parser's list, in its order; each name's module adds that name."""
    assert list(_subcommands(build_parser())) == list(COMMANDS)
    for name in COMMANDS:
        assert name in _subcommands(build_parser(name)), name


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "completion"])
def test_a_subcommand_alone_parses_and_helps_as_in_the_full_parser(name: str) -> None:
    """Every option, default and help line of the lone subcommand is the full parser's (the
    global -v/-q on every leaf included)."""
    full, alone = _subcommands(build_parser())[name], _subcommands(build_parser(name))[name]
    assert _helps(alone, name) == _helps(full, name)
    assert {a.dest: a.default for a in alone._actions} == {a.dest: a.default for a in full._actions}


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status", "r"], "status"),
        (["-v", "-q", "--json", "wait", "r"], "wait"),
        (["--verifier", "status", "wait", "r"], "wait"),  # the address is not the command
        (["--verifier=unix:/s", "seal", "w"], "seal"),
        (["--verif", "status", "wait", "r"], "wait"),  # abbreviated, as argparse accepts
        (["exec", "--run", "r", "--", "status"], "exec"),
        (["-h", "status"], None),  # the top help lists every command
        (["--help"], None),
        (["completion", "bash"], None),  # walks the whole tree
        (["statu", "r"], None),  # argparse says what the choices are
        (["--verifier"], None),
        ([], None),
    ],
)
def test_the_command_is_told_before_parsing_or_the_whole_parser_is_built(
    argv: list[str], command: str | None
) -> None:
    assert command_of(argv) == command


def test_the_top_options_that_take_a_value_are_those_command_of_skips() -> None:
    """globalopts.TOP_OPTIONS_WITH_A_VALUE is every option of the top parser that takes a
    value (a new one not listed would make command_of read its value as the command)."""
    parser = build_parser("status")
    top = [a for a in parser._actions if a.option_strings and a.nargs != 0]
    taking = {o for a in top for o in a.option_strings if o.startswith("--")}
    assert taking == set(globalopts.TOP_OPTIONS_WITH_A_VALUE)


def test_an_abbreviated_address_option_parses_as_in_the_full_parser() -> None:
    """`verifier --verif status wait r`: the address is "status", the command wait."""
    argv = ["--verif", "status", "wait", "r", "--timeout", "1"]
    lazy = build_parser(command_of(argv)).parse_known_args(argv)[0]
    full = build_parser().parse_known_args(argv)[0]
    assert (lazy.command, lazy.global_verifier) == (full.command, full.global_verifier)
    assert (lazy.command, lazy.global_verifier) == ("wait", "status")


def _cli_modules_after(argv: list[str]) -> list[str]:
    code = (
        "import json, sys\n"
        "from servewitness._cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('servewitness._cli.'))),"
        " file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    modules: list[str] = json.loads(out.stderr.strip().splitlines()[-1])
    return modules


def test_a_named_command_imports_no_other_command() -> None:
    """`verifier wait --help` loads status_cmd (which adds status and wait) and no other command
    module; `verifier --help` loads them all (negative control: the check sees imports)."""
    cmd_modules = {f"servewitness._cli.{m}" for m in COMMANDS.values()}
    alone = set(_cli_modules_after(["wait", "--help"])) & cmd_modules
    assert alone == {"servewitness._cli.status_cmd"}
    assert set(_cli_modules_after(["--help"])) >= cmd_modules
