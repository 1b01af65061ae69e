"""``ampbench bench``: is the pipeline's loop as fast as the tutorial's bare loop, and what does each arm buy?

Needs only torch and torchvision (a GPU box often has nothing else): run it as ``python -m ampbench.bench``
with ``src/`` on PYTHONPATH, or as ``ampbench bench``. Everything is measured in one process by the speed stage's
harness (``speed/harness.py``): interleaved round by round in alternating order after a warm-up round, each round's
fastest timing window (device synchronisation at window edges), ratios as the median of per-round ratios with an
interval. It prints a table, writes JSON, and exits non-zero only on an error — never because a number is slow.

- ``config``: what to measure (``BenchConfig``), torch-free.
- ``loop``: the measuring (imports torch): the harness over every arm, the bare loop, FLOPs, state bytes.
- ``overhead``: the goal lines: the pipeline's loop against the bare loop and the logging share, each with its
  interval and a verdict from it (within, above, undecided), rounds added until it decides or the budget ends.
- ``cli``: the command line (every option checked before anything runs) and the table.
"""
