"""The verifier's clock for ages: seconds since boot that no one can step back.

Freshness is an age: how long ago the verifier received a target's evidence. Measured as a
difference of wall-clock times, a wall clock stepped back (by NTP, an administrator, a VM
restored from a snapshot) makes old evidence look new, and stepped back an hour a dead
agent's last report stays "fresh" for an hour. So ages are measured on ``CLOCK_BOOTTIME``:
it cannot be set, and unlike ``CLOCK_MONOTONIC`` (``time.monotonic`` on Linux) it keeps
counting while the host is suspended, so a verifier host woken after a night asleep does not
take the evening's evidence for a minute old. Where ``CLOCK_BOOTTIME`` does not exist
(not Linux), ``time.monotonic``. Wall-clock times stay what is displayed and ledgered.

Its origin is this boot: a value read before a restart of the verifier means nothing after it,
so the store never keeps one (evidence stored before a restart has no known age: not fresh).
"""

from __future__ import annotations

import time

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)
NAME = "CLOCK_BOOTTIME" if _BOOTTIME is not None else "monotonic"


def boot_s() -> float:
    """Seconds on the verifier's age clock (``CLOCK_BOOTTIME`` where it exists)."""
    if _BOOTTIME is not None:
        return time.clock_gettime(_BOOTTIME)
    return time.monotonic()
