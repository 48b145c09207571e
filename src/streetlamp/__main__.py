"""``python -m streetlamp ...``: the same as the ``streetlamp`` command."""

from .cli import main

raise SystemExit(main())
