"""The library side of the DVC stages that do more than one call: training an arm, timing every arm, evaluating.

- ``train``: the train stage: each seed fit, resumed or reused; the arm's summary.
- ``framework``: the train stage's seeds when a framework's own trainer trains (``train.framework: lightning``),
  its preflight and its arms for the speed stage.
- ``seed_record``: a trained seed's line in summary.json and what it records of what ran.
- ``preflight``: what the train stage checks before an arm trains: the request, and the arm's model built once (a dry
  step, its FLOPs by dtype).
- ``outputs``: ``SeedJob`` and ``ArmOutputs``: every side effect of training (files, runs, log lines; rank 0).
- ``resume``: when a checkpoint may be continued; the progress record; reuse of finished seeds.
- ``speed``: the speed stage: the harness (``speed/``) on the user's model, data and input path.
- ``evaluate``: the evaluate stage: predict every arm and seed, the verdicts, the reports.
- ``decide``: ``ampbench decide``: one ``dvc exp run`` per look of a sequential design, until it stops.
- ``sensitivity``: ``ampbench sensitivity``: the ranking of the modules to keep in float32, on a project's fp32 model.
- ``fix``: ``ampbench fix``: the search for the modules to keep in float32, its trials trained and judged as the
  stages do, its confirmation, what the fix costs.
- ``fix_record``: the search's record in reports/fix/ (read by the evaluate stage) and the run it belongs to.
- ``fix_exps``: each trial of the search as a DVC experiment (``dvc exp show``), the workspace untouched.
- ``runs``: what the evaluate stage puts into MLflow (seed runs, the parent run), and logging it.
"""
