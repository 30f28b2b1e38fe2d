"""The ``verifier`` command line: one module per subcommand, one ``except Error`` in main."""
