from ddlbench.cli import main

raise SystemExit(main())
