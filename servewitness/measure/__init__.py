"""Measurement of what vLLM boots do under load: the arithmetic of ``verifier sample`` and
``verifier compare``. ``compare`` turns one boot's probe counters into a sample (steps,
tokens, seconds, and the rates from them), reads saved samples back, and prices the
difference between two arms of replicate boots against the noise floor between boots of one
configuration; the CLI (``servewitness._cli.compare_cmd``) reads the probed processes.
"""
