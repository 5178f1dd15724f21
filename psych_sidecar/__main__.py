from psych_sidecar.cli import main

raise SystemExit(main())
