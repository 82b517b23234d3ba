import sys

from headway.serve._cli import main

sys.exit(main())
