"""``python -m tests.k8s build|up|down|status|e2e``: see ``tests.k8s.cli``."""

from tests.k8s.cli import main

raise SystemExit(main())
