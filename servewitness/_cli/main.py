"""Entry point of the ``verifier`` console script."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from typing import IO, cast

from servewitness import __version__
from servewitness._cli import (
    agent_cmd,
    audit_cmd,
    certs_cmd,
    compare_cmd,
    completion_cmd,
    diff_cmd,
    exec_cmd,
    fmt,
    globalopts,
    inspect_cmd,
    keygen_cmd,
    policy_cmd,
    report_cmd,
    run_cmd,
    serve_cmd,
    status_cmd,
    target_cmd,
    window_cmd,
)
from servewitness.errors import Error, exit_codes_help

EXIT_CODES = exit_codes_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verifier",
        description="Provenance and liveness evidence for live vLLM serving processes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"verifier {__version__}")
    globalopts.add_top(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    inspect_cmd.add_parser(sub)
    diff_cmd.add_parser(sub)
    policy_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    agent_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    status_cmd.add_parser(sub)
    target_cmd.add_parser(sub)
    window_cmd.add_parser(sub)
    exec_cmd.add_parser(sub)
    compare_cmd.add_parser(sub)
    audit_cmd.add_parser(sub)
    keygen_cmd.add_parser(sub)
    certs_cmd.add_parser(sub)
    report_cmd.add_parser(sub)
    completion_cmd.add_parser(sub)
    globalopts.install(parser)  # after every subcommand: -v/-q after the subcommand's name too
    parser.set_defaults(root_parser=parser)  # `completion` walks the whole tree
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    sys.stdout = fmt.TerminalSafe(cast(IO[str], fmt.Discard()) if quiet else out)
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
