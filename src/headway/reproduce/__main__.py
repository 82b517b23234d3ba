"""``python -m headway.reproduce pars --quick``: ``headway reproduce``."""

from headway.reproduce import main

raise SystemExit(main())
