"""``verifier report RUN --html OUT.html (--db DATABASE | --verifier ADDRESS | both)``: an
auditor's report of one run as one self-contained static HTML page (``servewitness.report``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servewitness._cli._audit_db import DB_HELP, reading
from servewitness._cli._audit_db import open_ro as _open
from servewitness._cli.common import add_verifier_option, rpc_timeout, tls_from
from servewitness._cli.fmt import add_json, result
from servewitness._cli.fmt import text as _t
from servewitness.errors import CheckFailed, ConfigError, UsageError

if TYPE_CHECKING:
    from servewitness.report.model import Report

DESCRIPTION = """\
Write one run's report as a self-contained static HTML page: the verdict, every target's
liveness with a timeline (SVG) of each process's steps and hook fires, provenance counts by
origin (pristine, patched, editable, stdlib, ...), the findings and the measurement windows
with their seals. The page has no script and loads nothing (inline CSS and SVG; a
Content-Security-Policy forbids both); every stored text is escaped. A huge run is cut to
fixed caps (targets, processes, timeline points, findings, windows) and the page says where.

From --db (the verifier's database, read-only, in one snapshot: no verifier needed): the
registration, the verdict history, the finding ids of the latest verdict, the timelines,
provenance and windows; every stored report, window and seal shown is checked against its
ledger entry first. From --verifier (a live verifier): the current verdict with every
finding's message and every target's liveness, but no history. Both: the verifier's current
verdict and liveness over the database's history.

Exit 0: the page is written (whatever the run's verdict; it is printed); 1: written, but
stored records differ from their ledger entries (left out, named on the page); 2: usage or
unknown run on the verifier; 3: no such database or cannot write OUT; 4: verifier
unreachable; 6: no such run in the database."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="write a run's auditor's report as one static HTML page",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="the registered run's name")
    p.add_argument(
        "--html",
        required=True,
        metavar="OUT.html",
        help="where to write the page (replaced whole, never left half-written)",
    )
    p.add_argument(
        "--db", metavar="DATABASE", help=DB_HELP + " (history, timelines, provenance, windows)"
    )
    add_json(p, '{"html", "run", "verdict", "targets", "findings", "windows"}: what was written')
    add_verifier_option(p)
    p.set_defaults(handler=run_report)


def _from_db(args: argparse.Namespace, now: float) -> Report:
    from servewitness.report import from_db

    db = _open(args.db)
    name = db.name
    with reading(db):
        return from_db.gather(db, args.run, now, name)


def _from_verifier(args: argparse.Namespace, now: float) -> Report:
    from servewitness.client.address import resolve
    from servewitness.client.api import VerifierClient
    from servewitness.report import from_verifier

    address = resolve(args.verifier)
    with VerifierClient(address, rpc_timeout(args), tls_from(args)) as client:
        verdict = client.status(args.run)
        targets = client.list_targets()
        summary = next((r for r in client.list_runs() if r.name == args.run), None)
    return from_verifier.gather(verdict, targets, summary, now, str(address))


def _write(path: Path, page: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(page, encoding="utf-8", errors="backslashreplace")
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"{path}: cannot write the report: {e.strerror}") from e


def run_report(args: argparse.Namespace) -> int:
    from servewitness.report import merge, render

    if args.db is None and args.verifier is None:
        raise UsageError("give --db DATABASE, --verifier ADDRESS, or both")
    now = time.time()
    if args.db is None:
        report = _from_verifier(args, now)
    else:
        report = _from_db(args, now)
        if args.verifier is not None:
            report = merge(report, _from_verifier(args, now))
    out = Path(args.html)
    _write(out, render(report))
    findings = len(report.findings)
    doc = {
        "html": str(out), "run": report.run, "verdict": report.verdict,
        "targets": len(report.targets), "findings": findings, "windows": len(report.windows),
    }  # fmt: skip
    line = (
        f"{_t(str(out), 0)}: run {_t(report.run)} {report.verdict or 'no verdict yet'}, "
        f"{len(report.targets)} target(s), {findings} finding(s), {len(report.windows)} "
        "window(s)"
    )
    result(args, doc, [line])
    if report.mismatches:
        raise CheckFailed(
            f"{len(report.mismatches)} stored record(s) differ from their ledger entries and "
            f"are left out of the page (first: {report.mismatches[0]}); `verifier audit verify "
            "--db` lists every difference"
        )
    return 0
