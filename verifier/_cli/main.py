"""Entry point of the ``verifier`` console script."""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence

from verifier import __version__
from verifier._cli import (
    agent_cmd,
    audit_cmd,
    certs_cmd,
    compare_cmd,
    diff_cmd,
    exec_cmd,
    fmt,
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
from verifier.errors import Error, exit_codes_help

EXIT_CODES = exit_codes_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verifier",
        description="Provenance and liveness evidence for live vLLM serving processes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"verifier {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
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
    from verifier import _logging

    _logging.configure(args.verbose)
    out, err = sys.stdout, sys.stderr
    # what is printed holds stored values: nothing in them reaches the terminal as a control
    # sequence (fmt.TerminalSafe), and nothing fails to encode (a lone surrogate, LANG=C)
    for stream in (out, err):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    sys.stdout = fmt.TerminalSafe(out)
    sys.stderr = fmt.TerminalSafe(err, keep_cr=True)
    try:
        code: int = args.handler(args)
    except Error as e:
        print(f"verifier: error: {fmt.message(e.explain())}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout.flush()
        sys.stdout, sys.stderr = out, err
    return code


if __name__ == "__main__":
    raise SystemExit(main())
