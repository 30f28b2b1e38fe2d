"""The only place logging is configured (CLI entry points only; never in the probe).

JSON lines on stderr when stderr is not a terminal, human-readable otherwise.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog


class _Stderr:
    """``sys.stderr`` as it is when a line is written, not when logging was configured: the CLI
    can run in-process (``main([...])`` in a test, or a tool embedding it), and a stream
    replaced since (a test's capture, closed when the test ends) must not take logging with
    it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(verbosity: int = 0) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=False)
        if sys.stderr.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _Stderr())),
        cache_logger_on_first_use=True,
    )
