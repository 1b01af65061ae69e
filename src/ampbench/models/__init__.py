"""The models: the built-ins, the built-in GPT, and ``train.model`` → a model checked against its task.

- ``builtins``: small_cnn, resnet18, mlp, vit_tiny; ``unwrap`` (the model inside DDP and torch.compile).
- ``gpt``: a small GPT (causal SDPA attention, tied head), the language model's default.
- ``factory``: ``train.model`` (a built-in, ``torchvision.<name>`` or your factory) → a model; the dry run;
  parameters and FLOPs per sample.
"""
