"""Generated wire code (checked in, drift-checked by ``make proto-check``).

Only ``servewitness/wire.py``, servicers and clients import ``servewitness.api.v1``; everything
else uses the domain types in ``servewitness.model``.
"""
