"""Signed attestations over the audit ledger, verifiable offline (docs/audit.md).

- :mod:`~verifier.audit.merkle`: RFC 6962/9162 tree heads, inclusion and consistency proofs
- :mod:`~verifier.audit.keys`: the verifier's Ed25519 key
- :mod:`~verifier.audit.dsse`: DSSE v1 envelopes
- :mod:`~verifier.audit.statement`: in-toto Statement v1 and the project's predicates
- :mod:`~verifier.audit.bundle`: the export bundle, built and verified
- :mod:`~verifier.audit.verify_cli`: ``verifier audit verify BUNDLE --key PUB``
"""
