from fleetgate.docsgen.pages import main

raise SystemExit(main())
