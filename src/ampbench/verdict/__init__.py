"""Is an arm worse than fp32? The metrics, the paired statistics, the verdicts and what would decide them.

- ``metrics``: per arm and seed: accuracy, loss, agreement, KL, logit differences, ECE against fp32.
- ``variance``: variance components of the paired differences: seeds, examples, residual.
- ``stats``: paired intervals (Tango with a design effect, t over seeds), fp32's seed noise, the margins.
- ``decisions``: *equivalent* and *not worse* from one-sided bounds; against fp32's seed noise.
- ``sequential``: seeds until decided: looks from a minimum of seeds, alpha-spending boundaries, the stop.
- ``plan``: the test examples or seeds that would give 80% power to decide.
- ``quality``: time to fp32's quality: steps to its validation loss × time per step.
- ``comparison``: an arm against fp32, typed: ``ArmReport`` (its summary.json, metrics, speed, numerics), its
  outcomes, ``PairedStatistics`` (both metrics' intervals and verdicts).
- ``search``: which modules to keep in float32: growth along a ranking, bisection, elimination, a budget in
  trainings, the verdict from a confirmation on fresh seeds.
- ``tables``: comparison.json, speed.json and details.json from the arms' reports.
"""
