"""What people read: the recommendation, the Markdown report, its numerics section, the figures, and verdicts
across DVC experiments.

- ``advice``: the recommendation, what limits an arm, the rerun lines that would decide or fix it.
- ``markdown``: reports/report.md (its first screen answers the question) and the DVC plot rows.
- ``numerics``: the report's numerics: FLOPs by dtype, the first non-finite module, activations.
- ``figures``: the PNG figures.
- ``experiments``: ``ampbench compare``: what changed in params and results across DVC experiments.
"""
