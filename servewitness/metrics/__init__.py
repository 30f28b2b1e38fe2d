"""Prometheus metrics of ``verifier serve`` and ``verifier agent`` (docs/operations.md).

``registry`` makes each daemon's registry on ``prometheus_client`` (the client vLLM itself
ships, so the agent adds nothing to a vLLM environment) and bounds the series a peer's names
can make; ``http`` is the endpoint that serves them. Each daemon's own metrics live with it
(``servewitness.server.metrics``, ``servewitness.agent.metrics``).
"""
