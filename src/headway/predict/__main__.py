"""``python -m headway.predict ...``: the ``headway predictor`` commands, standalone."""

from __future__ import annotations

import sys

from headway.predict._cli import main

if __name__ == "__main__":
    sys.exit(main())
