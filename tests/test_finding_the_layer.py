"""Numerics a user can act on: the first non-finite module, activation ranges, train.fp32_modules, FLOPs by dtype.

The planted-overflow model (examples/overflow_model.py: a ×10⁵ gain before a LayerNorm) runs through the train and
evaluate stages: fp16 fails, the finder names ``gain``, the activation table ranks it first, and with
``train.fp32_modules: [gain]`` the fp16 arm trains and is equivalent to fp32.
"""

import json
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from examples.overflow_model import Gain, build
from torch import nn

from ampbench.config.params import TrainParams
from ampbench.data.splits import Split
from ampbench.errors import Diverged
from ampbench.precision.policy import float32_matches, resolve_policy
from ampbench.report.advice import no_effect
from ampbench.training.activations import ActivationProbe, headroom_log2, merge_tables
from ampbench.training.flops import count_step_flops
from ampbench.training.loop import fit, init_state
from ampbench.training.nonfinite import replay_first_nonfinite
from ampbench.training.state import LoopConfig
from conftest import ROOT, dvc_exps

CPU = torch.device("cpu")


def _stage(name):
    import importlib

    return importlib.import_module(f"pipeline.{name}").main


# --- FLOPs by dtype: a hand count -------------------------------------------------------------------------------

def _small():
    """Conv2d(1→2, 3×3) on 6×6 → 2×4×4, then Linear(32→3): every FLOP countable by hand."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(32, 3))


# Batch of 2. Conv forward: 2 samples × 2×4×4 outputs × 9 multiply-adds × 2 = 1152; its backward needs only the
# weight gradient (the input needs none): 1152. Linear forward 2 × 2·32·3 = 384; backward: input gradient 384,
# weight gradient 384. Bias additions are not matmul FLOPs.
HAND_CONV, HAND_MATMUL = 1152 + 1152, 384 + 384 + 384


@pytest.mark.parametrize("arm, dtype", [("fp32", "float32"), ("fp16", "float16"), ("bf16", "bfloat16")])
def test_flops_by_dtype_match_a_hand_count(arm, dtype):
    model = resolve_policy(arm, CPU).prepare_model(_small())
    counted = count_step_flops(model, resolve_policy(arm, CPU), torch.randn(2, 1, 6, 6), torch.tensor([0, 2]))
    assert counted["by_kind_dtype"] == {f"conv/{dtype}": HAND_CONV, f"matmul/{dtype}": HAND_MATMUL}
    assert counted["total"] == HAND_CONV + HAND_MATMUL and counted["per_sample"] == (HAND_CONV + HAND_MATMUL) / 2
    assert counted["low_precision_share"] == (0.0 if arm == "fp32" else 1.0)  # fp32: nothing in 16 bits
    assert counted["dominant_dtype"] == dtype


def test_counting_leaves_training_unchanged():
    """The count runs a forward and backward: BatchNorm statistics, gradients and random state come back."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Dropout(0.5), nn.Flatten(), nn.Linear(32, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(4, 1, 6, 6)
    rng = torch.get_rng_state()
    count_step_flops(model, resolve_policy("fp32", CPU), x, torch.tensor([0, 1, 2, 0]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


def test_an_autocast_arm_that_ran_in_float32_is_flagged():
    """A model that switches autocast off inside its forward: the fp16 arm computes nothing in 16 bits."""

    class OptsOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = _small()

        def forward(self, x):
            with torch.autocast("cpu", enabled=False):
                return self.inner(x.float())

    policy = resolve_policy("fp16", CPU)
    counted = count_step_flops(OptsOut(), policy, torch.randn(2, 1, 6, 6), torch.tensor([0, 2]))
    assert counted["low_precision_share"] == 0.0
    assert no_effect(counted, policy.describe())
    ok = count_step_flops(_small(), policy, torch.randn(2, 1, 6, 6), torch.tensor([0, 2]))
    assert not no_effect(ok, policy.describe())
    fp32 = resolve_policy("fp32", CPU)  # no autocast asked for: nothing to flag
    assert not no_effect(counted, fp32.describe())


# --- the finder and the activation table -------------------------------------------------------------------------

def _blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    return Split((y.float() * 2 - 1)[:, None, None, None] + 0.8 * torch.randn(n, 1, 4, 4, generator=g), y)


def _fit(arm, model, fp32_modules=(), **train):
    policy = resolve_policy(arm, CPU, fp32_modules)
    model = policy.prepare_model(model)
    cfg = LoopConfig(TrainParams(**{"epochs": 2, "batch_size": 32, "progress": False, **train}))
    return fit(init_state(model, policy, cfg, CPU), _blobs(512, 0), _blobs(128, 1), policy, cfg)


@pytest.mark.parametrize("arm", ["fp16", "fp16_noscaler"])
def test_the_finder_names_the_planted_layer(arm):
    torch.manual_seed(0)
    with pytest.raises(Diverged) as err:
        _fit(arm, build((1, 4, 4), 2))
    assert err.value.culprit["module"] == "gain" and err.value.culprit["phase"] == "forward"
    assert "module 'gain' (Gain)" in str(err.value)
    table = merge_tables([err.value.activations])
    assert table[0]["module"] == "gain" and table[0]["nonfinite"] > 0 and table[0]["headroom_log2"] == -float("inf")


def test_the_activation_table_ranks_the_planted_layer_first_in_fp32():
    torch.manual_seed(0)
    records = _fit("fp32", build((1, 4, 4), 2))
    table = merge_tables([r.activations for r in records])
    assert table[0]["module"] == "gain" and table[0]["max_abs"] > 65504 and table[0]["headroom_log2"] < 0
    assert table[0]["overflow_frac"] > 0.05  # about a tenth of its outputs would be inf in float16
    assert all(r["headroom_log2"] > 0 for r in table[1:])  # nothing else comes near
    # Sampled steps only: 16 steps per epoch, every 10th sampled → 2 per epoch.
    assert {r["samples"] for r in table} == {4}
    assert all(r.nonfinite is None for r in records)


def test_with_the_layer_in_float32_fp16_trains_like_fp32():
    torch.manual_seed(0)
    f32 = _fit("fp32", build((1, 4, 4), 2))
    torch.manual_seed(0)
    f16 = _fit("fp16", build((1, 4, 4), 2), fp32_modules=["gain"])
    assert f16[-1].skipped_steps == 0 and f16[-1].val_accuracy == pytest.approx(f32[-1].val_accuracy, abs=0.02)
    table = {r["module"]: r for r in merge_tables([r.activations for r in f16])}
    assert table["gain"]["nonfinite"] == 0 and table["gain"]["max_abs"] > 65504  # float32 island: finite


class Flaky(nn.Module):
    """×10⁵ on the training forwards numbered in ``bad`` (0-based), identity otherwise."""

    def __init__(self, bad):
        super().__init__()
        self.bad, self.calls = set(bad), 0

    def forward(self, x):
        hit = self.training and self.calls in self.bad
        self.calls += self.training
        return x * 1e5 if hit else x


def test_skips_between_sampled_steps_are_hunted_down():
    """Overflow on steps 3-4 and 8-9 only (1-based), sampled every 5th: the check at step 6 sees two uncaught skips,
    hooks the next steps and catches step 8 in the act."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(flatten=nn.Flatten(), fc=nn.Linear(16, 8), flaky=Flaky({2, 3, 7, 8}),
                                      norm=nn.LayerNorm(8), head=nn.Linear(8, 2)))
    records = _fit("fp16", model, telemetry_every=5, epochs=1)
    assert records[0].skipped_steps == 4
    assert records[0].nonfinite["module"] == "flaky" and records[0].nonfinite["step"] == 8


def test_a_replay_names_the_layer_and_changes_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), bn=nn.BatchNorm1d(8), gain=Gain(1e5),
                                      norm=nn.LayerNorm(8), head=nn.Linear(8, 2)))
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    found = replay_first_nonfinite(model, resolve_policy("fp16", CPU), x, y, 65536.0, 1.0, step=7)
    assert (found.module, found.phase, found.step, found.how) == ("gain", "forward", 7, "replayed step")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with torch.no_grad():
        model.fc.weight[0, 0] = float("nan")  # weights already gone: named as such, not blamed on a later layer
    found = replay_first_nonfinite(model, resolve_policy("fp16", CPU), x, y, 1.0, 1.0, step=9)
    assert (found.module, found.phase) == ("fc", "weights")


def test_gradient_overflow_under_the_scale_is_found_in_the_backward():
    """Finite forward, but the loss scale × a large gradient overflows float16 in the backward."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc=nn.Linear(4, 8), big=Gain(3e3), head=nn.Linear(8, 2)))
    found = replay_first_nonfinite(model, resolve_policy("fp16", CPU), torch.randn(8, 4), torch.randint(0, 2, (8,)),
                                   65536.0, 1.0, step=1)
    # big's backward multiplies the (scaled) gradient by 3000: past 65504, so it is the module named.
    assert (found.module, found.phase) == ("big", "backward")


def test_a_skipped_step_that_overflowed_in_the_backward_is_replayed():
    """Training hooks outputs only; a step the scaler skipped with finite outputs is replayed (its weights are
    unchanged) with gradient hooks, at the scale it ran with: the module whose backward overflowed is named."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(flatten=nn.Flatten(), fc=nn.Linear(16, 8), big=Gain(3e3),
                                      head=nn.Linear(8, 2)))
    records = _fit("fp16", model, epochs=1)
    assert records[0].skipped_steps > 0
    first = records[0].nonfinite
    assert (first["module"], first["phase"], first["how"], first["step"]) == ("big", "backward", "replayed step", 1)
    assert first["loss_scale"] == 65536.0


def test_headroom_is_in_powers_of_two():
    assert headroom_log2(65504 / 8) == pytest.approx(3)
    assert headroom_log2(65504 * 4) == pytest.approx(-2)
    assert headroom_log2(float("inf")) == -float("inf") and headroom_log2(0.0) == float("inf")


def test_probe_hooks_come_off_after_the_step():
    model = _small()
    probe = ActivationProbe(model, CPU)
    with probe.attached():
        model(torch.randn(2, 1, 6, 6)).sum().backward()
    assert all(not m._forward_hooks for m in model.modules())
    assert probe.samples == 1 and probe.culprit() is None


# --- train.fp32_modules -----------------------------------------------------------------------------------------

def test_patterns_must_match_a_module():
    model = build((1, 4, 4), 2)
    assert float32_matches(model, ["gain"]) == ["gain"]
    assert float32_matches(model, ["fc*", "fc1"]) == ["fc1", "fc2"]
    with pytest.raises(ValueError, match="'gian' matches no module"):
        float32_matches(model, ["gian"])


def test_islands_work_for_pure_16_bit_weights_too():
    """fp16_pure: the island's weights and inputs are float32, its output goes back to float16 for the next layer
    (so there an island helps only when what it returns fits float16: not the planted ×10⁵ gain)."""
    torch.manual_seed(0)
    policy = resolve_policy("fp16_pure", CPU, ["gain", "norm"])
    model = policy.prepare_model(build((1, 4, 4), 2, gain=1.0))
    assert model.norm.weight.dtype == torch.float32 and model.head.weight.dtype == torch.float16
    out = model(policy.cast_input(torch.randn(3, 1, 4, 4)))
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    # its weights in strict fp32, as the evaluate stage runs them: the islands return float32 to float32 layers
    assert model.float()(torch.randn(3, 1, 4, 4)).dtype == torch.float32
    assert policy.describe()["fp32_modules"] == "gain,norm"
    assert resolve_policy("fp32", CPU, ["gain"]).describe()["fp32_modules"] == "none"  # nothing 16-bit to keep


# --- through the stages -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def easy(tmp_path_factory):
    """Easy 1-channel 8×8 synthetic data with a large test split (1080 images), so equivalence is decidable."""
    from conftest import prepare_synthetic

    return prepare_synthetic(tmp_path_factory.mktemp("easy"), {
        "max_test": None, "test_fraction": 0.45, "val_fraction": 0.1,
        "synthetic": {"image_size": 8, "channels": 1, "classes": 4, "count": 2400, "noise": 1.0}}, {
        "model": "examples.overflow_model:build", "model_code": "examples/overflow_model.py",
        "precisions": ["fp32", "fp16", "fp16_noscaler"], "seeds": [0], "epochs": 2, "batch_size": 64})


def _pipeline(params, data, tmp_path, write_params, name):
    path = str(write_params(params, f"{name}.yaml"))
    out = tmp_path / name / "models"
    for arm in params["train"]["precisions"]:
        result = CliRunner().invoke(_stage("train"), ["--precision", arm, "--params", path, "--data", str(data),
                                                      "--out", str(out / arm), "--resume-dir", str(tmp_path / "r")])
        assert result.exit_code == 0, result.output + str(result.exception)
    reports = tmp_path / name / "reports"
    result = CliRunner().invoke(_stage("evaluate"), ["--params", path, "--data", str(data), "--models", str(out),
                                                     "--reports", str(reports)])
    assert result.exit_code == 0, result.output + "".join(__import__("traceback").format_exception(result.exception))
    return out, reports


def test_find_the_layer_then_keep_it_in_float32(easy, tmp_path, mlflow_store, write_params):
    """The done-when of the numerics issue, end to end through the stages and MLflow."""
    import mlflow

    params, data = easy
    out, reports = _pipeline(params, data, tmp_path, write_params, "planted")
    details = json.loads((reports / "details.json").read_text())
    for arm in ("fp16", "fp16_noscaler"):
        summary = json.loads((out / arm / "summary.json").read_text())
        assert summary["diverged"] and summary["first_nonfinite"]["0"]["module"] == "gain"
        assert "module 'gain' (Gain)" in summary["diverged"]["0"]
        assert details[arm]["verdict"] == "diverged"
    fp32 = json.loads((out / "fp32" / "summary.json").read_text())
    assert fp32["activations"][0]["module"] == "gain" and fp32["activations"][0]["headroom_log2"] < 0
    assert json.loads((out / "fp32" / "activations-seed0.json").read_text())[0]["module"] == "gain"
    report = (reports / "report.md").read_text()
    assert """-S 'train.fp32_modules=["gain"]'""" in report
    assert "| `gain` | Gain |" in report
    assert "- **fp32**: 0% of matmul/conv/attention FLOPs in 16 bits" in report
    # counted before it failed
    assert "- **fp16**: 100% of matmul/conv/attention FLOPs in 16 bits (float16 100%" in report
    mlflow.set_tracking_uri(mlflow_store)
    runs = {r.info.run_name: r for r in mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")}
    assert runs["fp16-seed0"].data.tags["nonfinite.module"] == "gain"
    assert runs["fp16-seed0"].info.status == "FAILED"
    assert "activations-seed0.json" in [a.path for a in mlflow.MlflowClient().list_artifacts(
        runs["fp32-seed0"].info.run_id)]

    fixed = {**params, "train": {**params["train"], "fp32_modules": ["gain"]}}
    out, reports = _pipeline(fixed, data, tmp_path, write_params, "fixed")
    comparison = json.loads((reports / "details.json").read_text())
    assert comparison["fp16"]["verdict"] == "equivalent", comparison["fp16"]
    assert comparison["fp16"]["skipped_steps"] == 0
    assert comparison["fp16"]["low_precision_flop_share"] > 0.9 and comparison["fp32"]["low_precision_flop_share"] == 0
    assert "fp32_modules=gain" in (reports / "report.md").read_text()


def test_a_pattern_that_matches_nothing_stops_the_train_stage(easy, tmp_path, write_params):
    params, data = easy
    bad = {**params, "train": {**params["train"], "fp32_modules": ["gian"]}}
    path = str(write_params(bad))
    result = CliRunner().invoke(_stage("train"), ["--precision", "fp16", "--params", path, "--data", str(data),
                                                  "--out", str(tmp_path / "m"), "--resume-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "'gian' matches no module" in result.output
    assert not (tmp_path / "m").exists()


def test_islands_survive_copying_and_come_off_for_export():
    import copy

    from ampbench.precision.policy import without_float32

    policy = resolve_policy("fp16", CPU, ["gain"])
    model = policy.prepare_model(build((1, 4, 4), 2))
    twin = copy.deepcopy(model)
    assert twin.gain.forward.__self__ is twin.gain  # the copy's wrapper runs the copy, not the original
    plain = without_float32(twin)
    assert "forward" not in plain.gain.__dict__ and "forward" in model.gain.__dict__
    assert list(plain.state_dict()) == list(build((1, 4, 4), 2).state_dict())  # keys unchanged


@pytest.mark.slow
def test_islands_compile():
    """torch.compile traces the float32 island (a with-autocast block; hand-entered contexts in hooks do not)."""
    torch.manual_seed(0)
    policy = resolve_policy("fp16", CPU, ["gain"])
    model = policy.prepare_model(build((1, 4, 4), 2))
    compiled = torch.compile(model)
    x = torch.randn(8, 1, 4, 4)
    with policy.autocast():
        out = compiled(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    out.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


# --- when nothing overflows: which module to keep in float32 ----------------------------------------------------

def test_the_ranking_names_the_module_whose_fix_removes_the_error():
    """examples/offset_model.py's ``coords`` loses its input's differences in 16 bits (features around a large
    origin, every value finite); its leaf ``coords.proj`` kept alone would not help (the addition before it already
    ran in 16 bits), nor would any other module. And the planted fp16 overflow: keeping ``gain`` (or ``fc2``, whose
    float32 output ``gain`` then multiplies in float32) makes the output finite."""
    from examples.offset_model import build as offset_model

    from ampbench.errors import ParamsError
    from ampbench.tasks.classification import CLASSIFICATION
    from ampbench.training.sensitivity import rank

    torch.manual_seed(0)
    inputs = [torch.randn(64, 1, 8, 8) for _ in range(2)]
    for arm in ("bf16", "fp16"):
        r = rank(offset_model((1, 8, 8), 10), resolve_policy(arm, CPU), inputs, CLASSIFICATION)
        assert r.modules[0].module == "coords" and r.modules[0].kept < 0.02 * r.arm_error, r
        assert r.arm_error > 0.5 and all(m.kept > 0.5 * r.arm_error for m in r.modules[1:]), r
        assert {m.module for m in r.modules} >= {"fc1", "coords", "coords.proj", "head", "act1"}
    overflow = rank(build((1, 8, 8), 10), resolve_policy("fp16", CPU), inputs, CLASSIFICATION)
    assert overflow.arm_error == float("inf") and {m.module for m in overflow.modules[:2]} == {"gain", "fc2"}
    assert all(m.kept == float("inf") for m in overflow.modules[2:]), overflow
    # The arms that change the model, ranked on copies prepared as the train stage prepares them: 16-bit weights
    # (coords' float32 island), torchao's float8 layers under bf16 autocast (coords kept out of float8 as well)
    for arm, left in (("bf16_pure", 0.02), ("fp8_tensorwise", 0.1)):  # float8's rounding of fc1 stays
        model = offset_model((1, 8, 8), 10)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        r = rank(model, resolve_policy(arm, CPU), inputs, CLASSIFICATION)
        assert r.modules[0].module == "coords" and r.modules[0].kept < left * r.arm_error, (arm, r)
        assert r.arm_error > 0.5 and all(m.kept > 0.5 * r.arm_error for m in r.modules[1:]), (arm, r)
        assert all(m.alone != m.alone for m in r.modules)  # not measured for these arms: NaN
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the model as it was
        assert type(model.coords.proj) is torch.nn.Linear and "forward" not in model.coords.__dict__
    with pytest.raises(ParamsError, match="fp32 computes in float32: no module of it to keep in float32"):
        rank(build((1, 8, 8), 10), resolve_policy("fp32", CPU), inputs, CLASSIFICATION)


def test_a_degraded_arm_without_overflow_gets_its_fix_from_the_ranking(easy, tmp_path, mlflow_store, write_params,
                                                                       monkeypatch):
    """The issue's case end to end: bf16 trains the offset model to far worse than fp32 with every value finite,
    so the first-non-finite probe has nothing to name; `ampbench sensitivity bf16` ranks ``coords`` first and gives
    its -S line; `ampbench fix bf16` trains it, confirms it not worse on a fresh seed and says what it costs."""
    from ampbench.cli import main as ampbench

    root = _degraded_project(easy, tmp_path, write_params, "build")
    reports = root / "reports"
    assert json.loads((reports / "details.json").read_text())["bf16"]["not_worse"] != "not worse"
    assert not json.loads((root / "models" / "bf16" / "summary.json").read_text())["first_nonfinite"]
    result = CliRunner().invoke(ampbench, ["sensitivity", "bf16", "--root", str(root), "--top", "4"])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "| coords | Coordinates |" in result.output.splitlines()[4], result.output  # the first row
    assert """.venv/bin/dvc exp run --temp -S 'train.fp32_modules=["coords"]'""" in result.output
    report = (reports / "report.md").read_text()
    assert "`ampbench sensitivity bf16` ranks the modules" in report and "`ampbench fix bf16` finds the set" in report
    few = CliRunner().invoke(ampbench, ["sensitivity", "bf16", "--root", str(root), "--examples", "100"])
    assert few.exit_code == 0 and "on 100 validation examples" in few.output, few.output
    for args, message in ((["fp32"], "'fp32': not an arm of this run"), (["fp16"], "'fp16': not an arm of this run"),
                          (["bf16", "--seed", "7"], "--seed 7: not one of train.seeds")):
        bad = CliRunner().invoke(ampbench, ["sensitivity", *args, "--root", str(root)])
        assert bad.exit_code == 2 and bad.output.startswith("error: ") and message in bad.output, bad.output


    # `ampbench fix bf16`: the ranking's first module, trained and judged, confirmed on a fresh seed; the -S line.
    import mlflow

    before = (root / "params.yaml").read_bytes()
    found = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert found.exit_code == 0, found.output + str(found.exception)
    said = lambda out: [line for line in out.splitlines() if not line.startswith("[")]  # noqa: E731 (not the stages')
    lines = said(found.output)
    assert lines[0].startswith("bf16: worse against fp32 in this run.") or "inconclusive" in lines[0], lines[0]
    assert lines[1].startswith('trial 1: ["coords"] kept in float32, seeds [0]: not worse (Δaccuracy '), lines
    assert lines[2].startswith('confirmation: ["coords"] kept in float32, seeds [1]: not worse'), lines
    assert lines[3] == ('The search ended with ["coords"], minimal: without it the arm is as the run judged it. 2 of '
                        "10 trainings of bf16 spent (and 1 of fp32 on the fresh seeds)."), lines
    assert lines[5] == """  .venv/bin/dvc exp run --temp -S 'train.fp32_modules=["coords"]'"""
    assert re.fullmatch(r"Speed × fp32, timed together \(speed\.\* sizes\): bf16 as it was [\d.]+× \[[\d.]+, [\d.]+\]"
                        r"( unstable)?, with the fix [\d.]+× \[[\d.]+, [\d.]+\]( unstable)?\.", lines[6]), lines[6]
    # coords' two 64×64 matmuls (forward 2, backward 3: proj(origin) needs no input gradient) against fc1's
    # (forward 1, backward 1: the data needs none) and the head's 64×4 (1 and 2): 20480 of 29440 FLOPs per sample
    assert lines[7] == ("The modules kept in float32 take 69.6% of bf16's matmul and convolution FLOPs (one training "
                        "step counted by dtype)."), lines[7]
    assert (root / "params.yaml").read_bytes() == before
    assert lines[8] == ("The search's record: reports/fix/bf16.md (and on its MLflow run); `dvc repro` puts it into "
                        "reports/report.md"), lines
    record = (reports / "fix" / "bf16.md").read_text()  # what was ranked, what was tried, why it stopped
    assert record.startswith("# Which part of bf16 needs float32\n\nbf16: "), record
    for part in ("## Ranked", "| coords | Coordinates |", "## Tried", f"- {lines[1]}\n- {lines[2]}\n",
                 f"## Why it stopped, and the answer\n\n{lines[3]}\n", lines[5], lines[7]):
        assert part in record, (part, record)
    search = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`ampbench.role` = 'fix'")
    assert len(search) == 1 and search["tags.fix.modules"][0] == '["coords"]'
    artifacts = mlflow.artifacts.download_artifacts(run_id=search["run_id"][0], dst_path=str(tmp_path / "got"))
    assert (Path(artifacts) / "bf16.md").read_text() == record
    assert search["tags.fix.confirmation"][0] == "not worse" and search["tags.fix.minimal"][0] == "true"
    trials = mlflow.search_runs(search_all_experiments=True,
                                filter_string=f"tags.`mlflow.parentRunId` = '{search['run_id'][0]}'")
    assert sorted(trials["tags.fix.role"]) == ["confirmation", "confirmation", "search"], trials
    assert set(trials["tags.fix.verdict"].dropna()) == {"not worse"}
    runs = len(mlflow.search_runs(search_all_experiments=True))
    again = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])  # trains nothing: all kept
    again_lines = said(again.output)  # the same but the speed line: the harness times the arms again
    assert again.exit_code == 0 and "[bf16] seed" not in again.output, again.output
    assert again_lines[:6] == lines[:6] and again_lines[7:] == lines[7:], again_lines
    assert len(mlflow.search_runs(search_all_experiments=True)) == runs
    for args, message in ((["fp16"], "'fp16': not an arm of this run to fix"),
                          (["bf16", "--budget", "0"], "--budget 0: a trial on the run's 1 seed(s) and its")):
        bad = CliRunner().invoke(ampbench, ["fix", *args, "--root", str(root)])
        assert bad.exit_code == 2 and bad.output.startswith("error: ") and message in bad.output, bad.output
    # --until equivalent: the same trials (trained once, nothing new) judged by the equivalence verdict, in a search
    # run of its own; the trials stay under the search that trained them, with both verdicts
    equivalent = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root), "--until", "equivalent"])
    assert equivalent.exit_code == 0 and "[bf16] seed" not in equivalent.output, equivalent.output
    lines = said(equivalent.output)
    assert lines[1].startswith('trial 1: ["coords"] kept in float32, seeds [0]: equivalent (Δaccuracy '), lines
    assert lines[4] == "Confirmed on fresh seeds [1]: bf16 with them in float32 is equivalent to fp32. Adopt it:"
    assert "is equivalent to fp32" in (reports / "fix" / "bf16.equivalent.md").read_text()
    assert "is not worse than fp32" in (reports / "fix" / "bf16.md").read_text()  # the not-worse search's stays
    searches = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`ampbench.role` = 'fix'")
    assert sorted(searches["tags.fix.goal"]) == ["equivalent", "not worse"], searches
    assert sorted(searches["tags.fix.confirmation"]) == ["equivalent", "not worse"], searches
    trials = mlflow.search_runs(search_all_experiments=True,
                                filter_string=f"tags.`mlflow.parentRunId` = '{search['run_id'][0]}'")
    assert set(trials["tags.fix.equivalence"].dropna()) == {"equivalent"} and len(trials) == 3, trials
    # the evaluate stage (`dvc repro` after a search: reports/fix is its dependency) puts both records into report.md
    monkeypatch.setenv("DVC_ROOT", str(root))  # the project the records' run is identified in
    result = CliRunner().invoke(_stage("evaluate"), ["--params", str(root / "params.yaml"), "--data",
                                                     str(root / "data" / "prepared"), "--models", str(root / "models"),
                                                     "--reports", str(reports)])
    assert result.exit_code == 0, result.output + str(result.exception)
    report = (reports / "report.md").read_text()
    section = report[report.index("## Which part needs float32"):report.index("## Details")]
    assert section.index("### `ampbench fix bf16`\n") < section.index("### `ampbench fix bf16 --until equivalent`")
    for part in ("#### Ranked", "| coords | Coordinates |", f"#### Tried\n\n- {lines[1]}",
                 "is equivalent to fp32", "is not worse than fp32", "[fix/bf16.md](fix/bf16.md)",
                 "[fix/bf16.equivalent.md](fix/bf16.equivalent.md)"):
        assert part in section, (part, section)


def test_fix_trains_nothing_for_an_arm_already_not_worse(tmp_path):
    import yaml

    from ampbench.cli import main as ampbench
    from conftest import TINY

    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"],
                                                                             "precisions": ["fp32", "bf16"]}}))
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "comparison.json").write_text(json.dumps({"bf16": {"not_worse": "not worse"}}))
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output == "bf16 is already not worse than fp32 in this run: nothing to fix, nothing trained\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "reports"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**TINY, "train": {
        **TINY["train"], "precisions": ["fp32", "bf16"], "fp32_modules": ["fc1"]}}))
    bad = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(tmp_path)])
    said = "error: train.fp32_modules is ['fc1']: the search chooses it"
    assert bad.exit_code == 2 and bad.output.startswith(said), bad.output
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**TINY, "train": {**TINY["train"],
                                                                             "precisions": ["fp32", "bf16_sr"]}}))
    for command in ("fix", "sensitivity"):  # its optimizer updates bfloat16 weights: no module can stay in float32
        bad = CliRunner().invoke(ampbench, [command, "bf16_sr", "--root", str(tmp_path)])
        assert bad.exit_code == 2 and bad.output.startswith("error: bf16_sr: a pure-bf16 arm keeps no float32 "
                                                            "weights"), bad.output


def _committed(root: Path) -> Path:
    """``root`` (a _degraded_project) as a user's project: a git repository with DVC and the pipeline's dvc.yaml,
    its params and reports committed, the models and data left to DVC (.gitignore)."""
    import shutil

    reports = root / "reports"
    run = reports.resolve()
    reports.unlink()
    shutil.copytree(run, reports)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / ".gitignore").write_text("/models\n/data/prepared\n/.resume/\n")
    for command in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "the run"]):
        subprocess.run(command, cwd=root, check=True, capture_output=True)
    return root


def _degraded_project(easy, tmp_path, write_params, model: str, seeds: tuple[int, ...] = (0,), **train) -> Path:
    """A project as `dvc repro` leaves it (params.yaml, data/prepared, models/, reports/) whose bf16 arm trained
    ``examples.offset_model:<model>`` to far worse than fp32, every value finite; with several ``seeds``, a trial
    of `ampbench fix` looks after each from the second (evaluate.sequential.min_seeds)."""
    from conftest import QUICK_SPEED

    params, data = easy
    params = {**params, "train": {**params["train"], "model": f"examples.offset_model:{model}", "seeds": list(seeds),
                                  "model_code": "examples/offset_model.py", "precisions": ["fp32", "bf16"],
                                  **train},
              "evaluate": {**params.get("evaluate", {}), "sequential": {"min_seeds": 2}}, "speed": QUICK_SPEED}
    out, reports = _pipeline(params, data, tmp_path, write_params, model)
    details = json.loads((reports / "details.json").read_text())
    assert all(details[arm]["delta_accuracy_pp"] < -10 for arm in params["train"]["precisions"][1:]), details
    root = tmp_path / "project"
    (root / "data").mkdir(parents=True)
    (root / "data" / "prepared").symlink_to(data, target_is_directory=True)
    (root / "models").symlink_to(out, target_is_directory=True)
    (root / "reports").symlink_to(reports, target_is_directory=True)
    (root / "params.yaml").write_text((tmp_path / f"{model}.yaml").read_text())
    return root


def test_fix_searches_fp16_and_float8_arms(easy, tmp_path, mlflow_store, write_params):
    """The planted model degrades fp16 autocast (10 mantissa bits still lose differences around 4096) and float8
    training (torchao's Float8Linear under bf16 autocast, float8's numerics emulated on the CPU) as it does bf16.
    Each search finds ``coords`` and confirms it on a fresh seed; for float8, keeping it in float32 keeps its Linear
    out of float8 (torchao's module filter) while fc1 still trains in float8."""
    from ampbench.cli import main as ampbench
    from ampbench.precision.float8 import cpu_can_run
    from ampbench.report.advice import fix_line

    arms = ["fp16"] + ([] if cpu_can_run() else ["fp8_tensorwise"])
    root = _degraded_project(easy, tmp_path, write_params, "build", precisions=["fp32", *arms])
    for arm in arms:
        result = CliRunner().invoke(ampbench, ["fix", arm, "--root", str(root)])
        assert result.exit_code == 0, result.output + str(result.exception)
        lines = [line for line in result.output.splitlines() if not line.startswith("[")]
        assert lines[1].startswith('trial 1: ["coords"] kept in float32, seeds [0]: not worse'), lines
        assert lines[4] == f"Confirmed on fresh seeds [1]: {arm} with them in float32 is not worse than fp32. Adopt it:"
        assert lines[5] == f"  {fix_line(['coords'])}", lines
    if "fp8_tensorwise" in arms:  # the run's arm and each trial (search and confirmation) of the set
        for summary in [root / "models" / "fp8_tensorwise" / "summary.json",
                        *(root / ".resume" / "fix" / "fp8_tensorwise").glob("*/fp8_tensorwise/summary.json")]:
            ran = json.loads(summary.read_text())["float8"]
            kept = {m["module"]: (m["converted"], m["reason"]) for m in ran["modules"]}
            coords = (True, None) if summary.parts[-3] == "models" else (False, "kept in float32 (train.fp32_modules)")
            assert kept == {"fc1": (True, None), "coords.proj": coords, "head": (False, "64→4 not divisible by 16")}


def test_fix_keeps_two_modules_when_neither_alone_is_enough(easy, tmp_path, mlflow_store, write_params,
                                                            monkeypatch):
    """Two offset layers in a row: keeping either alone leaves the other to lose the signal; the search ends with
    both, each one's removal tried and failed, confirmed on a fresh seed. Interrupted in its second trial first:
    that trial's run ends KILLED, params.yaml is as it was, and the rerun goes on from the trials done."""
    import mlflow

    from ampbench.cli import main as ampbench
    from ampbench.stages.fix import fix_in_project
    from conftest import interrupted_at_epoch_log

    root = _degraded_project(easy, tmp_path, write_params, "build_two")
    before = (root / "params.yaml").read_bytes()
    interrupted_at_epoch_log(monkeypatch, 3, lambda: fix_in_project("bf16", root, say=lambda line: None))
    killed = mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'KILLED'")
    assert len(killed) == 1 and killed["tags.precision"][0] == "bf16", killed
    assert (root / "params.yaml").read_bytes() == before
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "minimal: removing any one of its modules made the arm fail" in result.output, result.output
    assert "Confirmed on fresh seeds [1]" in result.output, result.output
    search = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`ampbench.role` = 'fix'")
    assert sorted(json.loads(search["tags.fix.modules"][0])) == ["coords", "coords2"], result.output
    assert search["metrics.fix.trainings"][0] <= 13, result.output  # the default budget: 3 × ⌈log2(11)⌉ + 1
    # a trial is reused only for the same run: after `dvc exp run -S train.model=…:build` the same set on the same
    # seeds is another training (found benchmarking: build's ["coords"] trials were reused for build_two)
    from ampbench.config.validation import load_params, validate
    from ampbench.stages.fix import _Trials

    params = load_params(root / "params.yaml")
    other = params.to_dict()
    other["train"]["model"] = "examples.offset_model:build"
    folders = [_Trials("bf16", p, root, (0,), print, "not worse")._folder(("coords",), (0,))
               for p in (params, load_params(root / "params.yaml"), validate(other))]
    assert folders[0] == folders[1] != folders[2], folders


def test_fix_says_when_no_set_of_modules_helps(easy, tmp_path, mlflow_store, write_params):
    """The offset matmul in the model's own forward, outside any submodule: even every candidate kept in float32
    leaves bf16 worse; the search says so, with the closest set, and confirms nothing. On three seeds, each trial
    looks after its second seed as `ampbench decide` does: so clear a failure stops there."""
    from ampbench.cli import main as ampbench

    root = _degraded_project(easy, tmp_path, write_params, "build_unfixable", seeds=(0, 1, 2))
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert result.exit_code == 0, result.output + str(result.exception)
    lines = [line for line in result.output.splitlines() if not line.startswith("[")]
    assert ("each looked at after every seed from 2 on (pocock alpha spending: a clear case stops early); a budget "
            "of 21 trainings of bf16") in lines[0], lines[0]  # 3 × ⌈log2(3)⌉ × 3 + 3
    tried = [line.split(": worse (")[0] for line in lines[1:3]]
    assert [line.split(" kept in")[1] for line in tried] == [" float32, seeds [0, 1]"] * 2, lines
    assert sorted(json.loads(tried[1].split(": ")[1].split(" kept")[0])) == ["fc1", "head"], tried
    assert lines[3].startswith("No set of modules found: no set helps: with all 2 candidate modules kept in float32 "
                               "the arm is still worse; the closest: "), lines
    assert lines[3].endswith(". 4 of 21 trainings of bf16 spent."), lines[3]
    assert "confirmation:" not in result.output and "Adopt it" not in result.output
    folder = root / ".resume" / "fix" / "bf16"
    assert len(list(folder.glob("*/bf16/seed1.pt"))) == 2 and not list(folder.glob("*/bf16/seed2.pt"))  # nor a third


def test_fix_works_for_a_task_of_your_own(easy, tmp_path, mlflow_store, write_params):
    """The planted model trained by examples/my_task.py's Task (label smoothing) instead of the built-in one: the
    ranking takes the Task's logits, the trials train and are judged through it, and the answer is the same. On
    three seeds, looking after the second: the trial and the confirmation stop at the look that decides them, and
    the cost is that of the set confirmed."""
    from ampbench.cli import main as ampbench

    root = _committed(_degraded_project(easy, tmp_path, write_params, "build", seeds=(0, 1, 2),
                                        task="examples.my_task:task", task_code="examples/my_task.py"))
    before = (root / "params.yaml").read_bytes()
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert result.exit_code == 0, result.output + str(result.exception)
    lines = [line for line in result.output.splitlines() if not line.startswith("[")]
    trial, confirmation = (re.fullmatch(r'(?:trial 1|confirmation): \["coords"\] kept in float32, seeds \[([\d, ]+)\]: '
                                        r"not worse \(Δaccuracy .*", line) for line in lines[1:3])
    assert trial and confirmation, lines
    used = [len(m.group(1).split(", ")) for m in (trial, confirmation)]
    assert f"{sum(used)} of 30 trainings of bf16 spent (and {used[1]} of fp32 on the fresh seeds)." in lines[3], lines
    assert lines[4].startswith("Confirmed on fresh seeds [3, 4"), lines
    assert lines[7].startswith("The modules kept in float32 take "), lines  # the confirmed set's own count
    runs = __import__("mlflow").search_runs(search_all_experiments=True, filter_string="tags.`fix.role` = 'search'")
    assert set(runs["params.train.task"]) == {"examples.my_task:task"}, runs
    # in a git repository each trial is a DVC experiment: the params it trained under, its verdict; params.yaml as
    # it was, and nothing new in the workspace but the search's record
    assert lines[-1] == ("`dvc exp show` lists the trials as DVC experiments (fix-bf16-1, fix-bf16-confirmation): "
                         "the params each trained under and its verdict (reports/fix_trial.json); `dvc exp apply "
                         "NAME` takes a trial's params"), lines
    exps = dvc_exps(root)
    assert sorted(exps) == ["fix-bf16-1", "fix-bf16-confirmation"], exps
    for name, said, role in (("fix-bf16-1", trial, "search"),
                             ("fix-bf16-confirmation", confirmation, "confirmation")):
        train, fix = exps[name]["params"]["train"], exps[name]["metrics"]["reports/fix_trial.json"]["fix"]
        seeds = [int(s) for s in said.group(1).split(", ")]
        assert (train["fp32_modules"], train["seeds"], train["precisions"]) == (["coords"], seeds, ["fp32", "bf16"])
        assert (fix["role"], fix["verdict"], fix["seeds"], fix["deciding"]) == (role, "not worse", len(seeds),
                                                                               "accuracy (pp)"), fix
        assert f"Δaccuracy {fix['delta']:+.2f} pp, one-sided bound {fix['bound']:+.2f} pp" in said.group(0), fix
        run = __import__("mlflow").get_run(fix["mlflow_run"])
        assert run.data.tags["fix.dvc_exp"] == name and run.data.tags["fix.role"] == role, run.data.tags
    assert (root / "params.yaml").read_bytes() == before
    status = subprocess.run(["git", "status", "--porcelain", "-uall"], cwd=root, capture_output=True, text=True)
    assert status.stdout.split("\n") == ["?? reports/fix/bf16.json", "?? reports/fix/bf16.md", ""], status.stdout
