"""Generated wire code (checked in, drift-checked by ``make proto-check``).

Only ``verifier/wire.py``, servicers and clients import ``verifier.api.v1``; everything else uses
the domain types in ``verifier.model``.
"""
