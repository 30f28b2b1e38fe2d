"""The client side of the verifier: what a benchmark harness and the CLI's client commands use.

- :mod:`~servewitness.client.address`: where the verifier listens and where clients find it
  (``HOST:PORT``, ``unix:PATH`` or a socket path; ``--verifier``, ``VERIFIER_ADDRESS``)
- :mod:`~servewitness.client.api`: :class:`VerifierClient`, the gRPC calls with errors translated
  into the exit-code contract
- :mod:`~servewitness.client.deadline`: how long a call may take (the time the user gave, or the
  per-call default) and calling an unreachable verifier again until then
- :mod:`~servewitness.client.gate`: the measurement gate (:func:`wait_for`, the
  :func:`measurement` context manager)
- :mod:`~servewitness.client.window`: measurement windows (open, pace, seal)

A harness needs one import::

    from servewitness.client import measurement
"""

from servewitness.client.api import VerifierClient
from servewitness.client.gate import GateFailed, Measurement, measurement, wait_for

__all__ = ["GateFailed", "Measurement", "VerifierClient", "measurement", "wait_for"]
