from verifier._cli.main import main

raise SystemExit(main())
