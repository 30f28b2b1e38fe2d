"""``[[distributions]]``: the version and content a pristine distribution must have.

``[provenance] pristine`` holds every loaded file of a distribution to its ``RECORD``, and the
RECORD is the installer's: another version, a wheel rebuilt with other code under the same
name, or a file and its RECORD line edited together when the image was built all pass it. A
pin holds the distribution to what was published: its version (METADATA's) and, optionally,
its content digest (``evidence/content.py``: one sha256 over the RECORD's rows of what the
wheel shipped), which ``verifier policy pin-wheel`` computes from the published wheel and
``verifier policy init`` writes from a boot you trust.

Judged from the agent's provenance of each judged process: every install of the pinned name
it reports (``Provenance.contents``: each one, so a second ``.dist-info`` of the same name is
seen too) must have the pinned version and content; a process that loaded files of the name
without a content digest for it (an agent before session 29) is not taken as matching.
"""

from __future__ import annotations

from dataclasses import dataclass

from servewitness.model import Finding, Severity
from servewitness.policy import _evidence as E
from servewitness.policy import findings as F
from servewitness.policy import interface as I


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    content_sha256: str | None = None
    note: str = ""


@dataclass(frozen=True)
class DistributionsPinned:
    """``provenance.distribution.mismatch`` (ERROR) per judged process and pin it breaks."""

    pins: tuple[Pin, ...]

    def describe(self) -> str:
        return "[[distributions]] " + ", ".join(f"{p.name}=={p.version}" for p in self.pins)

    def evaluate(self, snapshot: I.TargetSnapshot, ctx: I.EvalContext) -> list[Finding]:
        procs, out = E.any_main(snapshot, ctx, self.describe())
        for p in E.probed(procs):
            if p.provenance is None:
                continue  # ViewsAgree reports it (provenance.unjudged, PENDING)
            loaded = {d for d, _, _ in p.provenance.distributions}
            for pin in self.pins:
                installs = [(v, c) for d, v, c in p.provenance.contents if d == pin.name]
                why = _broken(pin, installs, pin.name in loaded)
                if why is None:
                    continue
                out.append(
                    E.finding(
                        F.DISTRIBUTION_MISMATCH,
                        Severity.ERROR,
                        f"{E.name(p)}: {pin.name} is not the pinned {pin.version}: {why}",
                        snapshot,
                        **E.base(p),
                        distribution=pin.name,
                        expected_version=pin.version,
                        expected_content_sha256=pin.content_sha256,
                        installs=[{"version": v, "content_sha256": c} for v, c in installs],
                    )
                )
        return out


def _broken(pin: Pin, installs: list[tuple[str, str]], loaded: bool) -> str | None:
    """Why INSTALLS (version, content digest) of PIN's name break it, or None."""
    if loaded and not installs:
        return "its content digest was not reported (an older agent?)"
    for version, content in installs:
        if version != pin.version:
            return f"version {version} is installed"
        if pin.content_sha256 is not None and content != pin.content_sha256:
            return (
                f"its RECORD lists other content ({E.short_sha(content)}, pinned "
                f"{E.short_sha(pin.content_sha256)}): another build, or files and RECORD "
                "lines edited together"
            )
    return None
