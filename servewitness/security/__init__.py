"""Transport security and authorization: a lab CA (``certs``), TLS credentials (``tls``),
and who may call what (``auth``)."""
