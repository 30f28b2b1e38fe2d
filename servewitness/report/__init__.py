"""An auditor's report of one run as one self-contained static HTML page
(``verifier report RUN --html OUT.html``).

Gathering and rendering are apart: :mod:`servewitness.report.from_db` reads a verifier's database
(read-only), :mod:`servewitness.report.from_verifier` turns what a live verifier answers into the
same value (:class:`servewitness.report.model.Report`), :func:`servewitness.report.model.merge`
joins the two, and :mod:`servewitness.report.page` (with :mod:`servewitness.report.svg` for the
charts) renders it. Every stored or answered text is hostile (an agent names its target): the page
escapes all of it, holds no script, loads nothing from anywhere, and says so in a
Content-Security-Policy that forbids scripts besides.
"""

from __future__ import annotations

from servewitness.report.model import Report, merge
from servewitness.report.page import render

__all__ = ["Report", "merge", "render"]
