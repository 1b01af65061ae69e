"""What a training job computes — its batches, its model's contract, its loss, its right answers, how two arms are
compared — so that the loop, the probes and the evaluation need not know.

- ``contract``: ``Task`` (the methods a task provides) and ``SeedEvaluation`` (what it gives per arm and seed).
- ``classification``: images → classes, the default task.
- ``language_model``: next-token prediction over byte tokens, judged by its loss per token.
- ``resolve``: ``train.task`` → a Task: a built-in, or yours, checked against the contract.
- ``probe``: the contract held on what a task returns: its loss at the dry run, its per-example outcomes (one per
  test example, the same in the same order on a second call) at the dry run and at evaluate.
"""
