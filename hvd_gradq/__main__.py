"""``python -m hvd_gradq``: the command line (:mod:`hvd_gradq.cli`)."""
from .cli import main

raise SystemExit(main())
