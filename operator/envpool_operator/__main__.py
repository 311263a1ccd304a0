"""``python -m envpool_operator [args]``: the same as ``envpool operator [args]``."""

import sys

from envpool_operator import cli

sys.exit(cli.main())
