"""A report's time on the way: bounded by the nonce it carries, never assumed to be nothing.

The verifier dates a report's evidence by the report's receipt less its age (the age the agent
measured on its boot clock, ``servewitness.ageclock``). That date is late by whatever time the
report spent between leaving the agent and reaching the handler: the network, the server's
queue, or a delay someone in the serving pod added to the agent's traffic (``tc qdisc ... netem
delay``). Late in the unsafe direction: evidence read before a window call, delayed past it,
would be dated after the call and open the window; evidence would look fresher than it is.

The nonce bounds it. Each acknowledgement (and each Hello reply) gives the agent the nonce its
next report must carry, and the verifier notes when it issued it, on its age clock. A report
carrying that nonce cannot have left before it was issued, nor before the agent had held it as
long as it says it had (``TargetReport.nonce_held_s``, on the agent's age clock). So:

    sent >= issued + held,  and the time on the way <= received - (issued + held)

which is ``Issued.transit_s``: the reply's way back and the report's way out, a round trip at
most, measured on clocks no one can step. Evidence is dated by receipt less that and less its
age: never later than it was read, whatever delayed the report. An agent older than
``nonce_held_s`` says nothing of how long it held the nonce: 0, and the bound is the whole
time since the nonce was issued (its evidence looks up to one report interval older than it
is, which errs on the safe side).

What it does not cover: an agent that lies (a larger ``held`` moves the date later, up to the
receipt less the age, which is what it could get by lying about the age already); the two age
clocks running at different rates (each is a kernel's, within parts per million).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from servewitness.server import clock
from servewitness.server.bounded import LruCache


@dataclass(frozen=True, slots=True)
class Issued:
    """A nonce, and when this verifier issued it on its age clock (``clock.boot_s``): taken
    before the reply that carries it is sent, so every report carrying it left after."""

    nonce: str
    at_boot_s: float

    def transit_s(self, received_boot_s: float, held_s: float | None) -> float:
        """The longest a report carrying this nonce, received at RECEIVED_BOOT_S, can have
        been on the way; HELD_S: how long its agent says it had held the nonce (None: not
        said). Never below 0 (a HELD_S longer than the nonce has existed is a lie, or clocks
        apart: the report is then dated by its receipt, as one could always be dated)."""
        return max(0.0, received_boot_s - self.at_boot_s - (held_s or 0.0))


class Nonces:
    """Each agent's current nonce and when it was issued: at most CAPACITY agents, the least
    recently heard from forgotten first (its next report is refused with "nonce mismatch" and
    it says Hello again)."""

    def __init__(self, capacity: int) -> None:
        self._issued: LruCache[str, Issued] = LruCache(capacity)

    def __len__(self) -> int:
        return len(self._issued)

    @property
    def evicted(self) -> int:
        """How many agents' nonces were forgotten to stay within the bound."""
        return self._issued.evicted

    def issue(self, agent_id: str) -> str:
        """A new nonce for AGENT_ID, its issue noted now: call before the reply that carries
        it is sent."""
        nonce = secrets.token_hex(16)
        self._issued.put(agent_id, Issued(nonce, clock.boot_s()))
        return nonce

    def current(self, agent_id: str, nonce: str) -> Issued | None:
        """AGENT_ID's current nonce when NONCE is it, else None (never issued, forgotten, or
        replaced by a later one: a replayed or stale report)."""
        issued = self._issued.get(agent_id)
        if issued is None or not secrets.compare_digest(issued.nonce, nonce):
            return None
        return issued
