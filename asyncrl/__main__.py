from asyncrl.cli import main

raise SystemExit(main())
