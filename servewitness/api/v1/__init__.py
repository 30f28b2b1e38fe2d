"""``servewitness.api.v1``: code generated from ``proto/verifier/api/v1/*.proto`` by
``scripts/gen_proto.sh`` (``make proto``). Do not edit the ``*_pb2*`` files by hand."""
