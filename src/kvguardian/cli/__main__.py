from kvguardian.cli import main

raise SystemExit(main())
