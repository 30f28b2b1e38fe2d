"""The audit ledger: everything that makes the verifier's stored records checkable, online
against the database or offline from an export (docs/audit.md).

- :mod:`~servewitness.ledger.interface`: the
  :class:`~servewitness.ledger.interface.Database` the ledger needs (``servewitness.server.db``
  provides SQLite and PostgreSQL ones)
- :mod:`~servewitness.ledger.chain`: the hash chain over every stored row; walking it
- :mod:`~servewitness.ledger.bindings`: request-binding rows, stored in batches the chain covers
- :mod:`~servewitness.ledger.checkpoints`: signed tree heads of the chain, stored while serving
- :mod:`~servewitness.ledger.merkle`: RFC 6962/9162 tree heads, inclusion and consistency proofs
- :mod:`~servewitness.ledger.keys`: the verifier's Ed25519 key
- :mod:`~servewitness.ledger.dsse`: DSSE v1 envelopes
- :mod:`~servewitness.ledger.statement`: in-toto Statement v1 and the project's predicates
- :mod:`~servewitness.ledger.bundle`: the export bundle: its entries, content kinds, building it
- :mod:`~servewitness.ledger.verify_bundle`: checking a bundle offline, with the public key alone
- :mod:`~servewitness.ledger.export`: the bundle for some requests and runs of a database
- :mod:`~servewitness.ledger.queries`: audit queries (a request, a file, a run) over a database
- :mod:`~servewitness.ledger.errors`: what can go wrong with keys and bundles

It may import the standard library, ``cryptography``, and ``servewitness.errors``,
``servewitness.model``, ``servewitness.wire`` and ``servewitness.policy``; never
``servewitness.server``, ``servewitness._cli`` or ``servewitness.agent`` (they use it, not the other
way round). Nothing here prints: the CLI (``servewitness._cli.audit_cmd``) says what the results
mean. Importing this package imports no submodule, so the store's hash chain does not load
``cryptography``.
"""
