"""One error hierarchy and the exit-code contract, in one place.

:class:`ExitCode` is the contract: every code the CLI can return, with what it means and
which commands return it. The CLI's ``--help`` epilog and docs/gate.md's "Exit codes" table
are both rendered from it (a test checks that page against :func:`exit_codes_table`).

Each code above 0 has exactly one base error class here; every other error in the package
derives from exactly one of them and never sets ``exit_code`` itself (a test walks the
package and checks both). Library code raises these; only the CLI turns them into an exit
status (``servewitness._cli.main``: one ``except Error``).
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar


class ExitCode(IntEnum):
    """What a ``verifier`` command's exit status means."""

    meaning: str
    when: str

    def __new__(cls, value: int, meaning: str, when: str = "") -> ExitCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        member.when = when
        return member

    OK = 0, "success"
    FAILED = (
        1,
        "a check ran and failed",
        "`wait`: the run FAILed; `serve`, `audit`: the database is corrupt; `status`: some "
        "run FAILs; `seal`, `exec`: the window did not "
        "hold (`exec`: or the command's own nonzero code); `diff`: the two differ; `sample`: "
        "no step ran; `audit verify`: the ledger does not match; `audit verify-seal`: the seal "
        "does not verify, or its window did not hold; `report`: a stored record shown differs "
        "from its ledger entry (the page is written, naming it)",
    )
    USAGE = 2, "usage: bad arguments, or a pid that is not a Python process"
    CONFIG = 3, "start-up or configuration error"
    UNAVAILABLE = 4, "unavailable: no such process, permission denied, service unreachable"
    TIMEOUT = 5, "timeout", "`wait`"
    NOT_FOUND = (
        6,
        "not found: nothing in the records matches",
        "`audit request`, `audit file`, `audit run`, `audit export`, `report --db`",
    )
    BUNDLE_INVALID = (
        7,
        "an attestation bundle is corrupted or does not verify",
        "`audit verify BUNDLE`; `seal`, `exec`, `window`, `wait`: the verifier's answer is not "
        "what was asked (a seal of another window, run or results; a window or verdict of "
        "another run), or the seal's signature does not verify with `--key`",
    )
    WRONG_KEY = (
        8,
        "an attestation was signed by another key than the one given",
        "`audit verify BUNDLE`; `seal`, `exec`: the seal is signed by another key than `--key`",
    )
    DATABASE_UNREACHABLE = 9, "the verifier's database (PostgreSQL) cannot be reached"
    NOT_AUTHORIZED = 10, "not authorized: the verifier refused the caller's credentials or role"

    def describe(self) -> str:
        """The meaning with the commands that return it, as docs/gate.md's table says it."""
        return f"{self.meaning} ({self.when})" if self.when else self.meaning


def exit_codes_help() -> str:
    """The ``exit codes:`` epilog of ``verifier --help``."""
    return "exit codes:\n" + "".join(f"  {c.value:<2} {c.meaning}\n" for c in ExitCode)


def exit_codes_table() -> str:
    """docs/gate.md's "Exit codes" table (Markdown)."""
    rows = "".join(f"| {c.value} | {c.describe()} |\n" for c in ExitCode)
    return "| code | meaning |\n|---|---|\n" + rows


# The base error of each code ---------------------------------------------------------------


class Error(Exception):
    """Base of every error the CLI reports as one line (a bare ``Error``: exit 1)."""

    exit_code: ClassVar[ExitCode] = ExitCode.FAILED

    def explain(self) -> str:
        return str(self)


class CheckFailed(Error):
    """A check ran and failed: the gate, a window's seal, the ledger, a comparison."""

    exit_code = ExitCode.FAILED


class DatabaseCorrupt(CheckFailed):
    """The verifier's database opens but is damaged: not a database any more, pages that fail
    the engine's integrity check, a file cut short. What it holds cannot be trusted, so this
    reads as tampering (exit 1), not as a configuration mistake (a path that does not exist or
    cannot be opened: exit 3)."""


class UsageError(Error):
    exit_code = ExitCode.USAGE


class ConfigError(Error):
    exit_code = ExitCode.CONFIG


class UnavailableError(Error):
    exit_code = ExitCode.UNAVAILABLE


class NoAnswerInTime(UnavailableError):
    """A call's deadline passed without an answer (gRPC DEADLINE_EXCEEDED): the peer is hung
    or slow, or the call was given too little time to tell (``servewitness.client.deadline``)."""


class TimeoutError_(Error):  # the builtin TimeoutError is another thing
    exit_code = ExitCode.TIMEOUT


class NotFound(Error):
    """An audit query found nothing in the records."""

    exit_code = ExitCode.NOT_FOUND


class _Located(Exception):
    """Mixed into an error about one place in a document: ``location: problem``."""

    def __init__(self, problem: str, location: str = "") -> None:
        super().__init__(f"{location}: {problem}" if location else problem)
        self.problem = problem
        self.location = location


class BundleCorrupt(_Located, Error):
    """An attestation bundle is damaged, incomplete, or a check over it fails."""

    exit_code = ExitCode.BUNDLE_INVALID


class WrongKey(_Located, Error):
    """The signatures are not by the key given (made by another key)."""

    exit_code = ExitCode.WRONG_KEY


class DatabaseUnreachable(Error):
    """The PostgreSQL server could not be reached or refused the connection."""

    exit_code = ExitCode.DATABASE_UNREACHABLE


class NotAuthorized(Error):
    """The verifier refused the caller: no valid credentials, or not allowed to do this."""

    exit_code = ExitCode.NOT_AUTHORIZED


BASES: dict[ExitCode, type[Error]] = {
    ExitCode.FAILED: CheckFailed,
    ExitCode.USAGE: UsageError,
    ExitCode.CONFIG: ConfigError,
    ExitCode.UNAVAILABLE: UnavailableError,
    ExitCode.TIMEOUT: TimeoutError_,
    ExitCode.NOT_FOUND: NotFound,
    ExitCode.BUNDLE_INVALID: BundleCorrupt,
    ExitCode.WRONG_KEY: WrongKey,
    ExitCode.DATABASE_UNREACHABLE: DatabaseUnreachable,
    ExitCode.NOT_AUTHORIZED: NotAuthorized,
}
"""The one base error of every non-zero exit code."""


# Errors about processes (raised by the evidence collectors) ---------------------------------


class NoSuchProcess(UnavailableError):
    def __init__(self, pid: int) -> None:
        super().__init__(f"no process with pid {pid}")
        self.pid = pid


class ProcessExited(NoSuchProcess):
    """The process was there when its evidence was read, and gone (or a zombie) by the end:
    what was read of it is incomplete, so nothing is reported (exit code 4, like no pid)."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.args = (f"pid {pid} exited while it was being read",)


class ProcessAccessDenied(UnavailableError):
    def __init__(self, pid: int, what: str) -> None:
        super().__init__(f"cannot read {what} of pid {pid}: permission denied")
        self.pid = pid


class NotPythonProcess(UsageError):
    def __init__(self, pid: int, exe: str) -> None:
        super().__init__(f"pid {pid} is not a Python process ({exe or 'unknown executable'})")
        self.pid = pid
