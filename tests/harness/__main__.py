"""``python -m tests.harness build|up|down|status|e2e``: see ``tests.harness.cli``."""

from tests.harness.cli import main

raise SystemExit(main())
