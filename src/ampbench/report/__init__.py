"""What people read: the recommendation, the Markdown report, its numerics section, the figures, and verdicts
across DVC experiments.

- ``context``: ``RunContext``: the run as a whole (task, data, model, seeds, device, margins, seed noise).
- ``advice``: the ``Recommendation``, what keeps each arm from it, what limits an arm, the line that fixes one.
- ``plans``: the sample-size plans as rerun lines (``-S`` settings), and their short form.
- ``markdown``: reports/report.md: the first screen (the recommendation and one table), then the details.
- ``details``: the details section: method, the full table, reasons, plans, throughput, what ran.
- ``numerics``: the report's numerics: FLOPs by dtype, the first non-finite module, activations.
- ``plots``: the DVC plot rows (curves.json, quality.json).
- ``figures``: the PNG figures.
- ``experiments``: ``ampbench compare``: what changed in params and results across DVC experiments.
- ``fix``: what ``ampbench fix`` says: its answer, the fix's cost, the search's record (reports/fix/<arm>.md).
- ``size``: what a request far larger than the default is told while it trains: its plan, its estimated time.
"""
