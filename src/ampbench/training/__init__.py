"""The loop and what watches it: the tutorial's step, ``fit``, its state, the watchers and their probes.

- ``step``: the tutorial's step (``train_step``) and the one forward + loss everything else reuses.
- ``state``: ``LoopConfig``, ``TrainState``, ``EpochRecord``: what the loop takes, holds and gives.
- ``loop``: ``fit``: the step between two watchers → one ``EpochRecord`` per epoch; ``build_run``.
- ``watchers``: ``NumericsWatch`` (skips, probes, divergence) and ``SpeedWatch`` (timing windows, progress bar).
- ``instruments``: what the watchers hold: scaler health, timing windows, the progress bar, the sync guard.
- ``gradients``: the shares of gradients float16 would flush to zero or overflow, per layer.
- ``activations``: per-module output ranges against float16's limits, on sampled steps.
- ``nonfinite``: the first module that went non-finite: hooked steps, hunts, replays.
- ``flops``: the FLOPs of one step by the dtype each matmul, convolution and attention ran in.
- ``sensitivity``: which module to keep in float32 when nothing overflows, ranked on a trained fp32 model.
- ``checkpoint``: training state ⇄ file (atomic, weights_only, the same bytes every run).
"""
