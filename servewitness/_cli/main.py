"""Entry point of the ``verifier`` console script."""

from __future__ import annotations

import argparse
import importlib
import io
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import IO, cast

from servewitness import __version__
from servewitness._cli import fmt, globalopts
from servewitness.errors import Error, exit_codes_help

EXIT_CODES = exit_codes_help()

# Each subcommand's name -> the module of servewitness._cli that adds it (``add_parser``), in
# the order ``--help`` lists them. A command line that names one imports that module alone
# (a client command starts in half the time: grpc, the policy engine and the evidence readers
# of the other commands stay unloaded); ``--help`` before the name, an unknown name and
# ``completion`` (it walks the whole tree) build every command.
COMMANDS: dict[str, str] = {
    "inspect": "inspect_cmd",
    "diff": "diff_cmd",
    "policy": "policy_cmd",
    "serve": "serve_cmd",
    "agent": "agent_cmd",
    "run": "run_cmd",
    "status": "status_cmd",
    "wait": "status_cmd",
    "target": "target_cmd",
    "window": "window_cmd",
    "seal": "window_cmd",
    "exec": "exec_cmd",
    "sample": "compare_cmd",
    "compare": "compare_cmd",
    "audit": "audit_cmd",
    "keygen": "keygen_cmd",
    "certs": "certs_cmd",
    "report": "report_cmd",
    "completion": "completion_cmd",
}


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ARGV names, where it can be told before parsing; None where the whole
    parser is needed (no name, an unknown one, ``-h`` before it, ``completion``)."""
    it = iter(argv)
    for word in it:
        if word in ("-h", "--help", "--"):
            return None
        if _takes_a_value(word):
            next(it, None)
            continue
        if word.startswith("-"):
            continue
        return word if word in COMMANDS and word != "completion" else None
    return None


def _takes_a_value(word: str) -> bool:
    """Whether WORD is a top-level option whose value is the next word, spelled out or
    abbreviated as argparse accepts (``--verif ADDR``)."""
    return len(word) > 2 and any(o.startswith(word) for o in globalopts.TOP_OPTIONS_WITH_A_VALUE)


def _command_modules(command: str | None) -> list[ModuleType]:
    names = [COMMANDS[command]] if command is not None else list(dict.fromkeys(COMMANDS.values()))
    return [importlib.import_module(f"servewitness._cli.{name}") for name in names]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``verifier`` parser: every subcommand, or COMMAND's module's alone."""
    parser = argparse.ArgumentParser(
        prog="verifier",
        description="Provenance and liveness evidence for live vLLM serving processes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"verifier {__version__}")
    globalopts.add_top(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules(command):
        module.add_parser(sub)
    globalopts.install(parser)  # after every subcommand: -v/-q after the subcommand's name too
    parser.set_defaults(root_parser=parser)  # `completion` walks the whole tree
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(command_of(sys.argv[1:] if argv is None else argv))
    # exits 2 with a usage line on bad arguments; a command that runs another (`exec`) takes
    # everything after its `--` as that command's own arguments
    args, rest = parser.parse_known_args(argv)
    if rest:
        if not getattr(args, "takes_command", False) or rest[0] != "--":
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        args.command_argv = rest[1:]
    globalopts.resolve(parser, args)
    from servewitness import _logging

    _logging.configure(args.verbose)
    out, err = sys.stdout, sys.stderr
    # what is printed holds stored values: nothing in them reaches the terminal as a control
    # sequence (fmt.TerminalSafe), and nothing fails to encode (a lone surrogate, LANG=C)
    for stream in (out, err):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    # -q silences a result, never the product a command is run for (a policy, a token, a
    # completion script: set_defaults(product_on_stdout=True)) nor JSON that was asked for
    quiet = args.quiet and not getattr(args, "json", False)
    quiet = quiet and not getattr(args, "product_on_stdout", False)
    shown: IO[str] = cast(IO[str], fmt.Discard()) if quiet else out
    # on a terminal, text wraps at its width (at most WIDTH); never JSON, nor a product (a
    # policy, a script: as they are), nor what a pipe gets (each line whole, for grep)
    as_is = getattr(args, "json", False) or getattr(args, "product_on_stdout", False)
    if not quiet and not as_is and _is_a_terminal(out):
        shown = cast(IO[str], fmt.Wrapped(out, min(fmt.WIDTH, _columns(out))))
    sys.stdout = fmt.TerminalSafe(shown)
    sys.stderr = fmt.TerminalSafe(err, keep_cr=True)
    try:
        try:
            code: int = args.handler(args)
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone(out)
    except Error as e:
        print(f"verifier: error: {fmt.message(e.explain())}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout, sys.stderr = out, err
    return code


def _is_a_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or a stand-in stream
        return False


def _columns(stream: IO[str]) -> int:
    """The terminal's width (WIDTH when it cannot say; never under 40)."""
    try:
        return max(40, os.get_terminal_size(stream.fileno()).columns)
    except (AttributeError, ValueError, OSError):
        return fmt.WIDTH


def _reader_gone(out: object) -> int:
    """The reader of stdout left (``verifier inspect --json | head -1``): end quietly, as a
    command killed by SIGPIPE would, with its status (128 + 13). What is still buffered for
    the closed pipe goes nowhere, so the interpreter's last flush cannot raise again."""
    import os

    try:
        fd = out.fileno()  # type: ignore[attr-defined]
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # not a real file (a test's capture): nothing will flush it at exit
    return EXIT_SIGPIPE


EXIT_SIGPIPE = 141


if __name__ == "__main__":
    raise SystemExit(main())
