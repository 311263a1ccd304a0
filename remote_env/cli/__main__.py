"""``python -m remote_env.cli`` is ``envpool``."""

from remote_env.cli import main

raise SystemExit(main())
