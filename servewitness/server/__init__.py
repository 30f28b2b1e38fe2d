"""The central verifier: run registry, report ingest, verdicts (``verifier serve``)."""
