"""``python -m ampbench.bench``: the bench's command line (``cli.py``)."""

import sys

from ampbench.bench.cli import main

sys.exit(main())
