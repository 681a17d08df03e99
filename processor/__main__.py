from processor.cli.main import main

raise SystemExit(main())
