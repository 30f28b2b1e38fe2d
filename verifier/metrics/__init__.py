"""Prometheus metrics of ``verifier serve`` and ``verifier agent`` (docs/operations.md).

``registry`` holds the metric types and the text exposition, ``http`` the endpoint that
serves them; each daemon's own metrics live with it (``verifier.server.metrics``,
``verifier.agent.metrics``). The package depends on nothing a vLLM environment lacks (the
standard library and structlog), since the agent runs in one; a later issue may replace the
registry by ``prometheus_client``.
"""
