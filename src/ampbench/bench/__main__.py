"""``python -m ampbench.bench``: the bench's command line (``cli.py``); an interrupted bench's 130 holds at exit."""

import sys

from ampbench.bench.cli import main
from ampbench.runtime import signals

signals.entry_point(lambda: sys.exit(main()))
