"""The one place that decides what an arm means: autocast, the GradScaler, TF32 flags, the optimizer and float8.

- ``policy``: an arm → a ``PrecisionPolicy`` on a device (autocast context, scaler, backend flags, optimizer,
  model preparation), or the reason the device cannot run it.
- ``optimizers``: torch's optimizers, torchao's with stochastic rounding, torch-optimi's with Kahan summation; the
  bytes of weights, gradients and optimizer state.
- ``float8``: which Linear layers train in float8 and why the others do not.
"""
