"""``python -m headway.reproduce reproduce pars --quick``."""

from headway.reproduce import main

raise SystemExit(main())
