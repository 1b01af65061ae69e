"""``ampbench bench``: is the pipeline's loop as fast as the tutorial's bare loop, and what does each arm buy?

Needs only torch and torchvision (a GPU box often has nothing else): run it as ``python -m ampbench.bench``
with ``src/`` on PYTHONPATH, or as ``ampbench bench``. Everything is measured in one process, A/B interleaved
round by round, after warm-up, as medians over timing windows with device synchronisation at window edges.
It prints a table, writes JSON, and exits non-zero only on an error — never because a number is slow.

``config.py``: what to measure (``BenchConfig``); ``loop.py``: the measuring (imports torch); ``cli.py``: the
command line and the table.
"""
