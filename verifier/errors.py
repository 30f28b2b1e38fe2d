"""One error hierarchy; every error knows its exit code and explains itself in one line.

Exit codes are a contract (README "Exit codes"):

====  =====================================================================
0     success (for checks: PASS)
1     a check ran and failed (FAIL)
2     usage: bad arguments, or a target that is not what the command needs
      (for example a pid that is not a Python process)
3     start-up or configuration error
4     unavailable: the target or service cannot be reached (no such pid,
      permission denied, verifier unreachable)
5     timeout
====  =====================================================================

Library code raises these; only the CLI turns them into an exit status.
"""

from __future__ import annotations


class Error(Exception):
    """Base of every error the CLI reports as one line."""

    exit_code = 1

    def explain(self) -> str:
        return str(self)


class UsageError(Error):
    exit_code = 2


class ConfigError(Error):
    exit_code = 3


class UnavailableError(Error):
    exit_code = 4


class TimeoutError_(Error):
    exit_code = 5


class NotAuthorized(Error):
    """The verifier refused the caller: no valid credentials, or not allowed to do this."""

    exit_code = 10


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
