"""The user's Task held to its contract, not only to its method names: the loss a 0-dim tensor with a grad path
(the dry run), one per-example outcome per test example, the same in the same order on a second call (the dry run
and evaluate, before any report), a non-finite loss with finite outputs named as the loss's, and no advice to keep
a module in float32 for an arm that already computes in float32."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from torch import nn

from ampbench.config.params import TrainParams
from ampbench.config.validation import validate
from ampbench.data.prepare import prepare, save_prepared
from ampbench.data.splits import Split
from ampbench.errors import Diverged, ParamsError
from ampbench.precision.policy import resolve_policy
from ampbench.stages.preflight import preflight
from ampbench.tasks.classification import CLASSIFICATION, Classification
from ampbench.tasks.contract import SeedEvaluation
from ampbench.training.loop import fit, init_state
from ampbench.training.state import LoopConfig
from conftest import TINY, train_fp32_only

CPU = torch.device("cpu")


def _preflight(params, data, task) -> dict:
    """The train stage's checks of the fp32 arm's model (``stages.preflight``); its identity."""
    return preflight("fp32", resolve_policy("fp32", CPU), params, data, task, CPU).model


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """(params, prepared data) of the tiny digits run, in memory."""
    params = validate(TINY)
    return params, prepare(params.prepare, tmp_path_factory.mktemp("raw"))


# --- the loss, at the dry run ------------------------------------------------------------------------------------

class FloatLoss(Classification):
    def loss(self, logits, y):
        return super().loss(logits, y).item()


class PerExampleLoss(Classification):
    def loss(self, logits, y):
        return nn.functional.cross_entropy(logits.float(), y, reduction="none")


class IntegerLoss(Classification):
    def loss(self, logits, y):
        return (logits.argmax(1) != y).sum()


class DetachedLoss(Classification):
    def loss(self, logits, y):
        return super().loss(logits, y).detach()


class OwnLeafLoss(Classification):
    """A tensor that requires grad, but of its own: no path to the model's parameters."""

    def loss(self, logits, y):
        return torch.tensor(super().loss(logits, y).item(), requires_grad=True)


BAD_LOSSES = [(FloatLoss, r"FloatLoss.loss returned a float \(\d\.\d+\)"),
              (PerExampleLoss, r"PerExampleLoss.loss returned a tensor of shape \(2,\), not one number"),
              (IntegerLoss, r"IntegerLoss.loss returned a tensor of dtype int64"),
              (DetachedLoss, r"DetachedLoss.loss returned a tensor without a grad path"),
              (OwnLeafLoss, r"OwnLeafLoss.loss returned a tensor with no grad path to the model's parameters")]


@pytest.mark.parametrize("task, expected", BAD_LOSSES, ids=[t.__name__ for t, _ in BAD_LOSSES])
def test_a_loss_that_breaks_the_contract_is_one_line_at_the_dry_run(task, expected, digits):
    """Each used to pass the dry run (which differentiated the logits' sum, not the loss) and then end training
    in a traceback (a float has no .backward) or train nothing (a detached loss)."""
    params, data = digits
    with pytest.raises(ParamsError, match=f"^train.task: {expected}.*0-dim floating tensor with a grad path") as err:
        _preflight(params, data, task())
    assert "\n" not in str(err.value)


def _counting(monkeypatch) -> list[int]:
    """Classification.evaluate, counting: the length of the split each call evaluates."""
    calls: list[int] = []
    evaluate = Classification.evaluate

    def counted(self, model, ref, policy, strict, test, *rest):
        calls.append(len(test))
        return evaluate(self, model, ref, policy, strict, test, *rest)

    monkeypatch.setattr(Classification, "evaluate", counted)
    return calls


def test_the_built_in_and_example_tasks_pass_the_probe_at_the_dry_run(digits, monkeypatch):
    """The dry run now evaluates the task on a few dozen test examples (it used to evaluate nothing): the built-in
    classification and examples/my_task.py pass, at the cost of three small evaluations."""
    from examples.my_task import task

    from ampbench.tasks.probe import PROBE_EXAMPLES

    params, data = digits
    calls = _counting(monkeypatch)
    for t in (CLASSIFICATION, task()):
        assert _preflight(params, data, t)["parameters"] > 0
    assert calls == [PROBE_EXAMPLES, PROBE_EXAMPLES, PROBE_EXAMPLES // 2] * 2


# --- per-example outcomes, at the dry run and at evaluate --------------------------------------------------------

class ShortOutcomes(Classification):
    """Drops the last test example (an off-by-one in a batch loop)."""

    def evaluate(self, *args) -> SeedEvaluation:
        r = super().evaluate(*args)
        return SeedEvaluation(r.metrics, {k: v[:-1] for k, v in r.outcomes.items()}, r.finite, r.predictions)


class ShuffledOutcomes(Classification):
    """Outcomes in a new random order on every call (e.g. gathered from a shuffled loader)."""

    def evaluate(self, *args) -> SeedEvaluation:
        r = super().evaluate(*args)
        order = np.random.default_rng().permutation(len(r.outcomes["loss"]))
        return SeedEvaluation(r.metrics, {k: v[order] for k, v in r.outcomes.items()}, r.finite, r.predictions)


class SortedOutcomes(Classification):
    """The same order every call, but not the test split's: sorted by loss."""

    def evaluate(self, *args) -> SeedEvaluation:
        r = super().evaluate(*args)
        order = np.argsort(r.outcomes["loss"], kind="stable")
        return SeedEvaluation(r.metrics, {k: v[order] for k, v in r.outcomes.items()}, r.finite, r.predictions)


BAD_OUTCOMES = [(ShortOutcomes, r"outcomes\['correct'\] has 31 entries for the 32 test examples"),
                (ShuffledOutcomes, r"outcomes\['(correct|loss)'\] change between two calls"),
                (SortedOutcomes, r"outcomes\['(correct|loss)'\] of the first 16 test examples differ between an "
                                 r"evaluation of the first 32 in batches of 16 and one of the first 16 one at a time")]


@pytest.mark.parametrize("task, expected", BAD_OUTCOMES, ids=[t.__name__ for t, _ in BAD_OUTCOMES])
def test_outcomes_that_cannot_be_paired_are_refused_at_the_dry_run(task, expected, digits):
    """Probed on the untrained model and the first test examples, before any arm trains."""
    params, data = digits
    with pytest.raises(ParamsError, match=f"^train.task: {task.__name__}.evaluate: {expected}") as err:
        _preflight(params, data, task())
    assert "\n" not in str(err.value) and "in test order" in str(err.value)


BAD_TASKS = '''
import numpy as np
from ampbench import Classification, SeedEvaluation


def _with(r, outcomes):
    return SeedEvaluation(r.metrics, outcomes, r.finite, r.predictions)


class Short(Classification):
    def evaluate(self, *args):
        r = super().evaluate(*args)
        return _with(r, {k: v[:-1] for k, v in r.outcomes.items()})


class Shuffled(Classification):
    def evaluate(self, *args):
        r = super().evaluate(*args)
        order = np.random.default_rng().permutation(len(r.outcomes["loss"]))
        return _with(r, {k: v[order] for k, v in r.outcomes.items()})


class Sorted(Classification):
    def evaluate(self, *args):
        r = super().evaluate(*args)
        order = np.argsort(-r.outcomes["loss"], kind="stable")
        return _with(r, {k: v[order] for k, v in r.outcomes.items()})


class Renamed(Classification):
    calls = 0

    def evaluate(self, *args):
        r = super().evaluate(*args)
        Renamed.calls += 1
        return r if Renamed.calls == 1 else _with(r, {"right": r.outcomes["correct"], "loss": r.outcomes["loss"]})
'''


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(params, prepared data, models folder) of a tiny fp32-only run with the built-in task, trained once."""
    root = tmp_path_factory.mktemp("trained")
    data = root / "prepared"
    save_prepared(prepare(validate(TINY).prepare, root / "raw"), data)
    params, _, models = train_fp32_only(root, data)
    return params, data, models


@pytest.mark.parametrize("task, expected", [
    ("Short", r"outcomes\['correct'\] has \d+ entries for the (\d+) test examples"),
    ("Shuffled", r"change between two calls on the same model and the same 32 test examples"),
    ("Sorted", r"of the first 32 test examples differ between an evaluation of the first 32 in batches of 16 and "
               r"one of the whole split in batches of 512"),
    ("Renamed", r"outcomes \['loss', 'right'\] on this call, \['correct', 'loss'\] on the first"),
])
def test_outcomes_that_cannot_be_paired_stop_evaluate_before_any_report(task, expected, trained, tmp_path,
                                                                        monkeypatch, mlflow_store):
    """Each used to be accepted: a verdict published on fewer examples than the test set, or on pairs that are
    not pairs (two evaluate runs disagreeing). Now one line, exit 2, and no report written."""
    from pipeline.evaluate import main as evaluate_stage

    raw, data, models = trained
    (tmp_path / "bad_tasks.py").write_text(BAD_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    params = yaml.safe_load(yaml.safe_dump(raw))
    params["train"].update({"task": f"bad_tasks:{task}", "task_code": "bad_tasks.py"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    reports = tmp_path / "reports"
    result = CliRunner().invoke(evaluate_stage, ["--params", str(tmp_path / "params.yaml"), "--data", str(data),
                                                 "--models", str(models), "--reports", str(reports)])
    err = result.stderr.strip()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert err.count("\n") == 0 and err.startswith(f"error: train.task: {task}.evaluate"), err
    assert re.search(expected, err) and "in test order" in err, err
    assert not reports.exists() or not any(reports.rglob("*"))


def test_the_built_in_task_passes_the_probe_at_evaluate(trained, tmp_path, mlflow_store, monkeypatch):
    """The baseline's first evaluation is probed (twice more, on the first test examples; it used to be taken as
    it came); the built-in task passes and the reports are written."""
    from pipeline.evaluate import main as evaluate_stage

    from ampbench.tasks.probe import PROBE_EXAMPLES

    raw, data, models = trained
    calls = _counting(monkeypatch)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(evaluate_stage, ["--params", str(tmp_path / "params.yaml"), "--data", str(data),
                                                 "--models", str(models), "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output
    assert calls[1:] == [PROBE_EXAMPLES, PROBE_EXAMPLES] and calls[0] > PROBE_EXAMPLES
    assert json.loads((tmp_path / "reports" / "details.json").read_text())["fp32"]["test_accuracy"] > 0.2


# --- a non-finite loss is the loss's, not a module's --------------------------------------------------------------

class NanNowAndThen(Classification):
    """Cross-entropy, but NaN on the training calls numbered in ``bad`` (0-based): a loss bug that strikes on some
    batches only (a mean over an empty mask, a log of 0)."""

    def __init__(self, bad):
        self.bad, self.calls = set(bad), 0

    def loss(self, logits, y):
        hit = self.calls in self.bad
        self.calls += 1
        loss = super().loss(logits, y)
        return loss * float("nan") if hit else loss


def _convnet():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(conv=nn.Conv2d(1, 4, 3, padding=1), relu=nn.ReLU(), flatten=nn.Flatten(),
                                     fc=nn.Linear(64, 2)))


def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    return Split((y.float() * 2 - 1)[:, None, None, None] + 0.8 * torch.randn(n, 1, 4, 4, generator=g), y)


def _fit(arm, task, **train):
    policy = resolve_policy(arm, CPU)
    model = policy.prepare_model(_convnet())
    cfg = LoopConfig(TrainParams(**{"epochs": 1, "batch_size": 32, "progress": False, **train}), task=task)
    return fit(init_state(model, policy, cfg, CPU), _blobs(512, 0), _blobs(64, 1), policy, cfg)


def test_a_loss_that_is_nan_now_and_then_in_fp32_is_named_as_the_losss(tmp_path):
    """Step 5's loss is NaN, between sampled steps (every 10th): the weights are ruined at once, so the next sampled
    step's hooks and the replay used to blame the first Conv2d. The per-step loss check names the loss."""
    with pytest.raises(Diverged) as err:
        _fit("fp32", NanNowAndThen({4}), telemetry_every=10)
    c = err.value.culprit
    assert (c["module"], c["module_type"], c["phase"], c["step"]) == ("(loss)", "NanNowAndThen.loss", "loss", 5)
    assert "the task's loss (NanNowAndThen.loss) made it, not a module of the model" in str(err.value)


@pytest.mark.parametrize("arm", ["fp32", "fp16"])
def test_a_nan_loss_on_a_hooked_step_is_the_losss(arm):
    """On a sampled (hooked) step: the outputs are finite, so the loss is named, not the last module's backward
    (fp16: the scaler skips the step; fp32: the run diverges)."""
    if arm == "fp16":
        records = _fit(arm, NanNowAndThen({10}), telemetry_every=5)  # step 11: hooked (a sampled step)
        c = records[0].nonfinite
    else:
        with pytest.raises(Diverged) as err:
            _fit(arm, NanNowAndThen({0}), telemetry_every=5)  # step 1: the first sampled step
        c = err.value.culprit
    assert (c["module"], c["phase"], c["how"]) == ("(loss)", "loss", "sampled step")


def test_a_replay_of_a_nan_loss_names_the_loss():
    from ampbench.training.nonfinite import replay_first_nonfinite

    found = replay_first_nonfinite(_convnet(), resolve_policy("fp16", CPU), torch.randn(8, 1, 4, 4),
                                   torch.randint(0, 2, (8,)), 65536.0, 1.0, step=3, task=NanNowAndThen({0}))
    assert (found.module, found.phase, found.step, found.how) == ("(loss)", "loss", 3, "replayed step")


# --- no advice to keep a module in float32 where it cannot help -------------------------------------------------

def _diverged_record(arm: str, culprit: dict) -> tuple[dict, list[str]]:
    from ampbench.stages.seed_record import diverged_record

    logged: list[str] = []
    out = SimpleNamespace(log=logged.append, numerics=lambda *a: None, node=None)
    job = SimpleNamespace(arm=arm, seed=0, policy=resolve_policy(arm, CPU), device=CPU)
    progress = SimpleNamespace(run_id="r", records=[])
    record = diverged_record(job, Diverged("diverged", culprit=culprit), progress, out, None)
    return record, logged


CONV = {"module": "conv", "module_type": "Conv2d", "phase": "weights", "step": 7, "loss_scale": 1.0,
        "how": "replayed step", "message": "first non-finite weights in module 'conv' (Conv2d) at step 7"}
LOSS = {**CONV, "module": "(loss)", "module_type": "NanNowAndThen.loss", "phase": "loss", "message": "loss"}


def test_the_baseline_is_never_told_to_keep_a_module_in_float32():
    """The train stage's record and log, and the report's numerics section: fp32 (and the loss, in any arm) get no
    train.fp32_modules rerun; a 16-bit arm's module still does."""
    from ampbench.report.numerics import _nonfinite_lines

    for arm, culprit in (("fp32", CONV), ("fp16", LOSS)):
        record, logged = _diverged_record(arm, culprit)
        assert "fix" not in record and not any("float32" in line for line in logged), (arm, record, logged)
    record, logged = _diverged_record("fp16", CONV)
    assert "train.fp32_modules=[\"conv\"]" in record["fix"]

    def arm(name, culprit):
        policy = resolve_policy(name, CPU).describe()
        return SimpleNamespace(arm=name, status="diverged", trained=SimpleNamespace(policy=policy),
                               numerics=SimpleNamespace(first_nonfinite={"0": culprit}))

    lines = _nonfinite_lines([arm("fp32", CONV), arm("bf16", LOSS), arm("fp16", CONV)])
    fp32, bf16, fp16 = (next(line for line in lines if line.startswith(f"- **{a}**")) for a in ("fp32", "bf16",
                                                                                                   "fp16"))
    assert "fp32_modules" not in fp32 and "fp32_modules" not in bf16 and "fp32_modules=[\"conv\"]" in fp16
