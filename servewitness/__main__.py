from servewitness._cli.main import main

raise SystemExit(main())
