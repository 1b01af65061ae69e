"""The one place that decides what an arm means: autocast, the GradScaler, TF32 flags, the optimizer and float8.

- ``policy``: an arm → a ``PrecisionPolicy`` on a device (autocast context, scaler, backend flags, optimizer,
  model preparation), or the reason the device cannot run it.
- ``optimizers``: torch's optimizers, torchao's with stochastic rounding, torch-optimi's with Kahan summation; the
  bytes of weights, gradients and optimizer state.
- ``float8``: which Linear layers train in float8 and why the others do not.
- ``packages``: the packages beyond torch some arms import (torchao, torch-optimi): installed, missing (the arm is
  skipped) or broken, probed in one place.
- ``checks``: the check stage's checks beyond params validation (device rules, code files, packages), which
  ``ampbench decide`` runs too.
"""
