"""``python -m ampbench.bench``: the bench's command line (``cli.py``)."""

import sys

from ampbench.bench.cli import main
from ampbench.runtime import signals

status = main()
if status == 130:  # interrupted: that status for sure (``signals.keep_status_at_exit``)
    signals.keep_status_at_exit(status)
sys.exit(status)
