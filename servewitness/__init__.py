"""Provenance and liveness verifier for live LLM serving.

Importing the package is cheap: the in-process probe (``servewitness_probe``) depends on it, so
nothing here may import anything beyond the standard library.
"""

__version__ = "0.1.0"
