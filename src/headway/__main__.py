"""``python -m headway ...``: the ``headway`` command."""

from headway.cli import main

raise SystemExit(main())
