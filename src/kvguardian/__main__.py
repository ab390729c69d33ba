from kvguardian.apps.cli import main

raise SystemExit(main())
