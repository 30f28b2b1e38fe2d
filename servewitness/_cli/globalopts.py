"""Options every subcommand takes, before or after its name: ``-v``, ``-q``, ``--json``,
``--verifier``.

argparse reads an option only at the level it was declared on, so ``verifier status -v`` would
be an error with ``-v`` on the top parser alone. :func:`install` declares the same options on
every leaf parser too, with ``SUPPRESS`` defaults there (an option not given after the
subcommand sets nothing), and :func:`resolve` merges the two and refuses
what the command cannot honour (``--json`` on a command that has no JSON output).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

VERBOSE_HELP = "more detail: file lists in full, info log lines (-vv: debug log lines)"
QUIET_HELP = "print no result on stdout (the exit code says it); errors and warnings still show"
JSON_HELP = "print the result as JSON (on commands that have a JSON form)"
VERIFIER_HELP = "verifier address, as the subcommand's own --verifier (on client commands)"


# The options of add_top that take a value (main.command_of skips the word after one).
TOP_OPTIONS_WITH_A_VALUE = ("--verifier",)


def add_top(parser: argparse.ArgumentParser) -> None:
    """The global options on the top-level parser (before the subcommand)."""
    parser.add_argument(
        "-v", "--verbose", dest="verbose_before", action="count", default=0, help=VERBOSE_HELP
    )
    parser.add_argument("-q", "--quiet", dest="quiet_before", action="store_true", help=QUIET_HELP)
    parser.add_argument("--json", dest="global_json", action="store_true", help=JSON_HELP)
    parser.add_argument("--verifier", dest="global_verifier", metavar="ADDRESS", help=VERIFIER_HELP)


def leaves(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser under PARSER that runs a command (has no subcommands of its own)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
        return
    for action in subs:
        for child in dict.fromkeys(action.choices.values()):  # aliases share one parser
            yield from leaves(child)


def _has(parser: argparse.ArgumentParser, option: str) -> bool:
    return option in parser._option_string_actions


def install(parser: argparse.ArgumentParser) -> None:
    """-v and -q on every leaf of PARSER as well (see the module)."""
    for leaf in leaves(parser):
        if not _has(leaf, "-v"):
            leaf.add_argument(
                "-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP
            )
        if not _has(leaf, "-q"):
            leaf.add_argument(
                "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP
            )


def resolve(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Merge the options given before the subcommand into ARGS (``-v`` counts wherever it was
    given: ``-v status -v`` is ``-vv``); a usage error (exit 2) for one the command does not
    take."""
    args.verbose = args.verbose_before + getattr(args, "verbose", 0)
    args.quiet = args.quiet_before or getattr(args, "quiet", False)
    if args.global_json:
        if not hasattr(args, "json"):
            parser.error(f"--json: `verifier {_name(args)}` has no JSON output")
        args.json = True
    if args.global_verifier is not None:
        if not hasattr(args, "verifier"):
            parser.error(f"--verifier: `verifier {_name(args)}` does not call a verifier")
        if args.verifier is None:
            args.verifier = args.global_verifier
    if args.quiet and args.verbose:
        parser.error("-q/--quiet and -v/--verbose: choose one")


def _name(args: argparse.Namespace) -> str:
    parts = [args.command]
    for key in ("run_command", "target_command", "action", "policy_command"):
        if isinstance(getattr(args, key, None), str):
            parts.append(getattr(args, key))
    return " ".join(parts)
