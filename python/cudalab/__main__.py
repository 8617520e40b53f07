"""``python -m cudalab``: the command line (see cudalab.cli)."""

from .cli import main

raise SystemExit(main())
