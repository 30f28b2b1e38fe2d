"""The audit ledger: everything that makes the verifier's stored records checkable, online
against the database or offline from an export (docs/audit.md).

- :mod:`~verifier.ledger.interface`: the :class:`~verifier.ledger.interface.Database` the ledger
  needs (``verifier.server.db`` provides SQLite and PostgreSQL ones)
- :mod:`~verifier.ledger.chain`: the hash chain over every stored row; walking it
- :mod:`~verifier.ledger.bindings`: request-binding rows, stored in batches the chain covers
- :mod:`~verifier.ledger.checkpoints`: signed tree heads of the chain, stored while serving
- :mod:`~verifier.ledger.merkle`: RFC 6962/9162 tree heads, inclusion and consistency proofs
- :mod:`~verifier.ledger.keys`: the verifier's Ed25519 key
- :mod:`~verifier.ledger.dsse`: DSSE v1 envelopes
- :mod:`~verifier.ledger.statement`: in-toto Statement v1 and the project's predicates
- :mod:`~verifier.ledger.bundle`: the export bundle: its entries, content kinds, building it
- :mod:`~verifier.ledger.verify_bundle`: checking a bundle offline, with the public key alone
- :mod:`~verifier.ledger.export`: the bundle for some requests and runs of a database
- :mod:`~verifier.ledger.queries`: audit queries (a request, a file, a run) over a database
- :mod:`~verifier.ledger.errors`: what can go wrong with keys and bundles

It may import the standard library, ``cryptography``, and ``verifier.errors``,
``verifier.model``, ``verifier.wire`` and ``verifier.policy``; never ``verifier.server``,
``verifier._cli`` or ``verifier.agent`` (they use it, not the other way round). Nothing here
prints: the CLI (``verifier._cli.audit_cmd``) says what the results mean. Importing this
package imports no submodule, so the store's hash chain does not load ``cryptography``.
"""
