from psych_sidecar.launch import main

raise SystemExit(main())
