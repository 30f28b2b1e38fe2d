"""The only place logging is configured (CLI entry points only; never in the probe).

JSON lines on stderr when stderr is not a terminal, human-readable otherwise.
"""

from __future__ import annotations

import logging
import sys

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
