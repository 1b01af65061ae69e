"""The Task contract held on what a task's methods *return*, not only on their names (``resolve.py`` checks those).

- ``check_loss`` and ``check_grad_path``: the training loss is a 0-dim floating tensor with a grad path to the
  model's parameters (the dry run, ``models.factory.check_built``, on two training samples);
- ``check_outcomes``: ``evaluate``'s per-example outcomes: one number per test example, the same keys on every call;
- ``probe_outcomes``: the same values in the same order on a second call, and each example's value its own (the
  first test examples cut into other batches give the same values). The pairing of arms, the basis of every
  verdict, rests on both: run at the dry run on the untrained model, and at evaluate on the baseline's first seed;
- ``HeldToContract``: a task whose ``evaluate`` is checked on every call and probed on the first baseline call.

A violation is one ``ParamsError`` line naming ``train.task``, the method and what it returned.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ampbench.config.arms import BASELINE
from ampbench.data.splits import Split
from ampbench.errors import ParamsError
from ampbench.precision.policy import resolve_policy
from ampbench.tasks.contract import SeedEvaluation, Task

PROBE_EXAMPLES = 32  # test examples the probe evaluates (three times): a reordering of them cannot pass unseen
RTOL, ATOL = 1e-3, 1e-5  # one example in batches of another size: kernels may round it otherwise, no more
TIES = 16  # one value in this many may differ (an argmax tie that a kernel for another batch size breaks otherwise)
LOSS_NEEDS = ("the loss must be a 0-dim floating tensor with a grad path to the model's parameters (training "
              "differentiates it)")
DRY_RUN_BINS = 10  # calibration bins at the dry run: the probe compares outcomes, not the metrics
PAIRING = "arms are paired example by example, so the outcomes must be one per test example, in test order"


def who(task: Any, method: str) -> str:
    """``train.task: <class>.<method>``: where a violation comes from, in the user's own names."""
    return f"train.task: {type(task).__name__}.{method}"


def loss_error(loss: Any) -> str | None:
    """What is wrong with a value ``Task.loss`` returned (None: a 0-dim floating tensor that requires grad)."""
    if not isinstance(loss, torch.Tensor):
        shown = f" ({loss:.4g})" if isinstance(loss, (int, float)) and not isinstance(loss, bool) else ""
        return f"returned a {type(loss).__name__}{shown}"
    if loss.dim() != 0:
        return f"returned a tensor of shape {tuple(loss.shape)}, not one number (a mean over the batch: .mean())"
    if not loss.is_floating_point():
        return f"returned a tensor of dtype {str(loss.dtype).removeprefix('torch.')}"
    if not loss.requires_grad:
        return ("returned a tensor without a grad path (computed under no_grad, detached, or rebuilt from a number: "
                ".item(), torch.tensor(...))")
    return None


def check_loss(task: Any, loss: Any) -> torch.Tensor:
    """``loss`` (what ``task.loss`` returned on the dry batch) when it fulfils the contract; ParamsError otherwise."""
    why = loss_error(loss)
    if why:
        raise ParamsError(f"{who(task, 'loss')} {why}; {LOSS_NEEDS}")
    return loss


def check_grad_path(task: Any, model: nn.Module) -> None:
    """After the loss's backward: a loss that requires grad but reached no parameter (a leaf tensor of its own)
    would train nothing."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and all(p.grad is None for p in trainable):
        raise ParamsError(f"{who(task, 'loss')} returned a tensor with no grad path to the model's parameters (a "
                          f"tensor of its own that requires grad); {LOSS_NEEDS}")


def _array(values: Any) -> np.ndarray | None:
    """``values`` as a numeric NumPy array, or None when they are not numbers (objects, a tensor on a GPU, …)."""
    try:
        a = np.asarray(values)
    except Exception:  # noqa: BLE001  (anything a user's evaluate returns)
        return None
    return a if np.issubdtype(a.dtype, np.number) or a.dtype == np.bool_ else None


def check_outcomes(task: Any, result: Any, n: int, keys: list[str] | None = None) -> list[str]:
    """The keys of ``result``'s (a ``SeedEvaluation``'s) outcomes, each a 1-D numeric array of one entry per test
    example (``n``), the same keys as ``keys`` (an earlier call's): ParamsError otherwise, before any report."""
    where = who(task, "evaluate")
    outcomes = getattr(result, "outcomes", None)
    if not isinstance(outcomes, dict) or not outcomes:
        raise ParamsError(f"{where} returned a {type(result).__name__} without per-example outcomes (a "
                          f"SeedEvaluation whose outcomes map names to arrays); {PAIRING}")
    if keys is not None and sorted(outcomes) != keys:
        raise ParamsError(f"{where}: outcomes {sorted(outcomes)} on this call, {keys} on the first (every arm and "
                          f"seed needs the same); {PAIRING}")
    for key, values in outcomes.items():
        a = _array(values)
        if a is None or a.ndim != 1:
            got = "not numbers" if a is None else f"of shape {a.shape}"
            raise ParamsError(f"{where}: outcomes[{key!r}] is {got}, not one number per test example; {PAIRING}")
        if len(a) != n:
            raise ParamsError(f"{where}: outcomes[{key!r}] has {len(a)} entries for the {n} test examples (a "
                              f"verdict on them would not be the test set's); {PAIRING}")
    return sorted(outcomes)


def _head(test: Split, n: int) -> Split:
    """The first ``n`` examples of ``test``, of the same type."""
    return replace(test, x=test.x[:n], y=test.y[:n])


def _differs(a: dict[str, Any], b: dict[str, Any], n: int) -> str | None:
    """The first outcome whose first ``n`` values differ between ``a`` and ``b`` beyond rounding, or None."""
    for key in sorted(a):
        x, y = (np.asarray(v, dtype=np.float64)[:n] for v in (a[key], b[key]))
        if np.count_nonzero(~np.isclose(x, y, rtol=RTOL, atol=ATOL, equal_nan=True)) > n // TIES:
            return key
    return None


def probe_outcomes(task: Any, model: nn.Module, test: Split, batch_size: int, calibration_bins: int,
                   known: SeedEvaluation | None = None) -> None:
    """Evaluate the first test examples (``model`` as the baseline: strict fp32, its own reference) twice in
    batches of half their number: the same values in the same order, else ParamsError. Then each example's value
    must be its own and in its place: against ``known`` (the whole split's evaluation, in ``batch_size`` batches)
    or, at the dry run, against the first half evaluated one at a time (another length and other batches: a
    reordering of the whole array, or within a batch, shows). A few dozen examples: cheap beside any evaluation."""
    n = min(len(test), PROBE_EXAMPLES)
    small = max(1, min(batch_size, (n + 1) // 2))  # two batches at least
    strict = resolve_policy(BASELINE, next(model.parameters()).device)
    keys = sorted(known.outcomes) if known is not None else None

    def run(m: int, size: int) -> dict[str, Any]:
        result = task.evaluate(model, model, strict, strict, _head(test, m), size, calibration_bins)
        check_outcomes(task, result, m, keys)
        return result.outcomes

    first = run(n, small)
    keys = keys or sorted(first)
    changed = _differs(first, run(n, small), n)
    if changed:
        raise ParamsError(f"{who(task, 'evaluate')}: outcomes[{changed!r}] change between two calls on the same "
                          f"model and the same {n} test examples (a random order, or randomness); {PAIRING}")
    half = max(1, n // 2)
    other, m, how = ((known.outcomes, n, f"the whole split in batches of {batch_size}") if known is not None else
                     (run(half, 1), half, f"the first {half} one at a time"))
    moved = _differs(first, other, m)
    if moved:
        raise ParamsError(f"{who(task, 'evaluate')}: outcomes[{moved!r}] of the first {m} test examples differ "
                          f"between an evaluation of the first {n} in batches of {small} and one of {how} (not in "
                          f"test order, or not per example); {PAIRING}")


class HeldToContract:
    """``task`` with its ``evaluate`` held to the contract: every call's outcomes checked (``check_outcomes``),
    the first baseline call's probed (``probe_outcomes``); everything else is the task's own."""

    def __init__(self, task: Task):
        self.task = task
        self.keys: list[str] | None = None
        self.probed = False

    def __getattr__(self, name: str) -> Any:
        if name in ("task", "keys", "probed"):  # not set yet (a copy being built): no recursion into self.task
            raise AttributeError(name)
        return getattr(self.task, name)

    def evaluate(self, model: nn.Module, ref_model: nn.Module, policy, strict, test: Split, batch_size: int,
                 calibration_bins: int) -> SeedEvaluation:
        result = self.task.evaluate(model, ref_model, policy, strict, test, batch_size, calibration_bins)
        self.keys = check_outcomes(self.task, result, len(test), self.keys)
        if ref_model is model and not self.probed:  # the baseline, its own reference: re-evaluating it is harmless
            self.probed = True
            probe_outcomes(self.task, model, test, batch_size, calibration_bins, result)
        return result
