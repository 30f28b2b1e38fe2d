"""A pytest plugin for a benchmark written as a test: the ``gated_measurement`` fixture.

Opt-in, never loaded by itself: the package registers no ``pytest11`` entry point, because
installing the verifier must not add a plugin to every pytest session of that environment.
Enable it for one session or for a project::

    pytest -p servewitness.client.pytest_plugin ...
    # pyproject.toml, [tool.pytest.ini_options]:
    #   addopts = ["-p", "servewitness.client.pytest_plugin"]
    # or a root conftest.py: pytest_plugins = ["servewitness.client.pytest_plugin"]

A test then measures inside a window the verifier opens and seals
(:func:`servewitness.client.gate.measurement`)::

    def test_decode_throughput(gated_measurement, tmp_path):
        out = tmp_path / "results.json"
        with gated_measurement("bench-1", results=out) as m:
            out.write_text(json.dumps(run_benchmark()))  # runs only once the run PASSes
        assert m.summary["held"]  # results.json.seal.json: the verifier's signed seal

Options: ``--verifier-address`` (else ``VERIFIER_ADDRESS``, else 127.0.0.1:50551),
``--verifier-run`` (the run when the test names none), ``--verifier-timeout`` (seconds the
verifier waits for a PASS at the open and for fresh evidence at the seal; default 120),
``--verifier-key`` (the verifier's public key, else ``VERIFIER_SEAL_KEY``: the seal's
signature is checked with it; without one it is not, and the record says so). TLS and token
come from ``VERIFIER_TLS_CA`` / ``_CERT`` / ``_KEY`` / ``VERIFIER_TOKEN``.

A gate that does not let the measurement count fails the test with the verifier's reason and
no traceback: the run FAILs or does not PASS in time (the block never runs), the verifier is
unreachable or refuses the caller, the window did not hold (after the seal is written), or
the verifier's answer is not what was asked (a window on another run; a seal of another
window, run or results, or one whose signature does not verify with the key: never written).
An exception raised inside the block is the test's own and passes through unchanged. Each
window is recorded in the test's ``user_properties`` (and so in JUnit XML): ``verifier_run``,
``verifier_window``, ``verifier_held`` (the checked seal's), ``verifier_seal``,
``verifier_seal_signature`` (``checked KEYID`` or ``not checked``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from servewitness.client.gate import Measurement, measurement
from servewitness.client.window import ENV_SEAL_KEY
from servewitness.errors import Error

GatedMeasurement = Callable[..., AbstractContextManager[Measurement]]

DEFAULT_TIMEOUT_S = 120.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("verifier", "gating benchmarks on a verifier (gated_measurement)")
    group.addoption(
        "--verifier-address",
        metavar="ADDRESS",
        default=None,
        help="the verifier (HOST:PORT, unix:PATH or a path; else VERIFIER_ADDRESS)",
    )
    group.addoption(
        "--verifier-run",
        metavar="RUN",
        default=None,
        help="the run a gated_measurement measures when the test names none",
    )
    group.addoption(
        "--verifier-timeout",
        metavar="S",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds the verifier waits for PASS at the open and for fresh evidence at the "
        f"seal (default {DEFAULT_TIMEOUT_S:g})",
    )
    group.addoption(
        "--verifier-key",
        metavar="PUB",
        default=None,
        help="the verifier's public key: each seal's signature is checked with it (else "
        f"${ENV_SEAL_KEY}; none: not checked, and the test's record says so)",
    )


@pytest.fixture
def gated_measurement(request: pytest.FixtureRequest) -> GatedMeasurement:
    """``gated_measurement(run=None, *, results=None, timeout_s=None, address=None,
    key=None)``: a context manager around the measured block (see the module's
    documentation)."""
    config = request.config

    def gate(
        run: str | None = None,
        *,
        results: Path | str | None = None,
        timeout_s: float | None = None,
        address: str | None = None,
        key: Path | str | None = None,
    ) -> AbstractContextManager[Measurement]:
        name = run or config.getoption("verifier_run")
        if not name:
            pytest.fail(
                "gated_measurement: name the run (gated_measurement('RUN')) or pass --verifier-run",
                pytrace=False,
            )
        timeout = timeout_s if timeout_s is not None else config.getoption("verifier_timeout")
        if not timeout > 0:
            pytest.fail(f"gated_measurement: the timeout must be > 0, not {timeout}", pytrace=False)
        return _gated(
            request.node,
            str(name),
            address or config.getoption("verifier_address"),
            float(timeout),
            Path(results) if results is not None else None,
            key=key or config.getoption("verifier_key"),
        )

    return gate


@contextmanager
def _gated(
    node: pytest.Item | pytest.Collector,
    run: str,
    address: str | None,
    timeout_s: float,
    results: Path | None,
    *,
    key: Path | str | None = None,
) -> Iterator[Measurement]:
    opened: list[Measurement] = []
    in_block = False
    why: str | None = None
    try:
        with measurement(run, address, timeout_s, results, key=key) as m:
            opened.append(m)
            in_block = True
            yield m
            in_block = False
    except Error as e:
        if in_block:
            raise  # the block's own error: the test's, not the gate's
        why = e.explain()
    if opened:
        _record(node, opened[0])
    if why is not None:  # failed outside the except block: no chained traceback in the report
        pytest.fail(f"verifier gate on run {run}: {why}", pytrace=False)


def _record(node: pytest.Item | pytest.Collector, m: Measurement) -> None:
    props = getattr(node, "user_properties", None)
    if props is None:
        return
    props.append(("verifier_run", m.run))
    props.append(("verifier_window", m.window.window_id))
    if m.sealed is not None:
        props.append(("verifier_held", m.sealed.held))  # the checked seal's content's
        kid = m.summary.get("signature_key_id")
        props.append(("verifier_seal_signature", f"checked {kid}" if kid else "not checked"))
    if "statement" in m.summary:
        props.append(("verifier_seal", m.summary["statement"]))
