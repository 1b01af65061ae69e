"""The one speed harness, used by the speed stage and by ``ampbench bench``: every arm in one process, interleaved
round by round in alternating order, each round's ratio to fp32, their median with an interval, peak memory with
one arm alive.

- ``budget``: the sizes of a measurement (rounds, steps, windows, warm-up) and each arm's wall-time budget over
  every phase it runs.
- ``harness``: an arm that trains through the pipeline's loop, the interleaving, the isolated-memory run.
- ``ratios``: the numbers (torch-free): per-round ratios, their median and order-statistic interval, a goal's
  verdict from it (within / above / undecided), words.
"""
