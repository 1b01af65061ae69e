"""Your Lightning job as it is: examples/lightning_classifier.py trained by Lightning's own Trainer under each arm's
precision plugin, read back as it trains; a module that overrides the arm refused with one line naming its line;
exact resume from Lightning's checkpoints; bad input as one line each; and the whole pipeline through
`dvc exp run` with the usual report. Skipped where Lightning is not installed, except in CI
(AMPBENCH_REQUIRE_LIGHTNING=1: there its absence fails)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import yaml

if not os.environ.get("AMPBENCH_REQUIRE_LIGHTNING"):
    pytest.importorskip("lightning")

from ampbench.config.layout import ArmFiles  # noqa: E402
from ampbench.config.validation import validate  # noqa: E402
from ampbench.data.prepare import prepare, save_prepared  # noqa: E402
from ampbench.errors import AmpbenchError, ArmUnavailable, DataError, ModelError  # noqa: E402
from ampbench.precision.policy import resolve_policy  # noqa: E402
from ampbench.stages.train import train_arm  # noqa: E402
from ampbench.training import checkpoint  # noqa: E402
from conftest import ARM_RUNS, QUICK_SPEED, ROOT, interrupted_at_epoch_log, make_project_repo, run_ok  # noqa: E402

EXAMPLE = "examples.lightning_classifier"


def lightning_params(base: dict, **train) -> dict:
    params = yaml.safe_load(yaml.safe_dump(base))
    params["prepare"].update({"dataset": f"{EXAMPLE}:DigitsData", "dataset_code": "examples", "max_train": None})
    params["train"].update({"framework": "lightning", "model": f"{EXAMPLE}:DigitsClassifier",
                            "model_code": "examples", "model_args": {"channels": 4}, **train})
    params["mlflow"]["log_model"] = False
    return params


@pytest.fixture
def setup(tmp_path, tiny_params, mlflow_store):
    params = validate(lightning_params(tiny_params, epochs=2, seeds=[0], precisions=["fp32", "fp16", "bf16"]))
    data_dir = tmp_path / "prepared"
    save_prepared(prepare(params.prepare, tmp_path / "raw"), data_dir)
    return params, data_dir, tmp_path


def _arm(arm, params, data_dir, root, name):
    return train_arm(arm, params, data_dir, root / name / arm, root, {}, resume_dir=root / name / ".resume" / arm,
                     code_version="test")


def test_each_arm_is_the_lightning_plugin_that_means_it():
    from ampbench.config.params import GradScalerParams
    from ampbench.frameworks.lightning import plugin, plugin_name

    cpu = torch.device("cpu")
    names = {arm: plugin_name(plugin(resolve_policy(arm, cpu), GradScalerParams()))
             for arm in ("fp32", "fp16", "bf16", "bf16_pure", "fp16_pure")}
    assert names == {"fp32": "32-true", "fp16": "16-mixed", "bf16": "bf16-mixed", "bf16_pure": "bf16-true",
                     "fp16_pure": "16-true"}
    # fp16 stays fp16 on the CPU (Lightning's precision="16-mixed" string would become bf16-mixed there), with the
    # pipeline's GradScaler settings.
    fp16 = plugin(resolve_policy("fp16", cpu), GradScalerParams(init_scale=1024.0))
    assert fp16.device == "cpu" and fp16.scaler.get_scale() == 1024.0
    for arm, why in (("bf16_sr", "configure_optimizers owns"), ("fp16_noscaler", "always scales"),
                     ("fp8_rowwise", "Transformer Engine")):
        with pytest.raises(ArmUnavailable, match=why):
            plugin(resolve_policy(arm, cpu), GradScalerParams())


def test_trained_through_lightning_and_read_back(setup):
    params, data_dir, root = setup
    summary = _arm("fp16", params, data_dir, root, "run")
    seed = summary["seeds"]["0"]
    ran = seed["framework"]
    assert ran["name"] == "Lightning" and summary["framework"] == ran
    assert ran["precision"] == "16-mixed" and ran["compute_dtypes"] == ["float16"]
    assert ran["autocast"] == ["float16"] and ran["weight_dtypes"] == ["float32"] and ran["grad_dtypes"] == ["float32"]
    assert summary["flops"]["low_precision_share"] == 1.0 and summary["model"]["kind"] == "lightning"
    history = json.loads(ArmFiles(root / "run" / "fp16").seed_history(0).read_text())
    assert [row["epoch"] for row in history] == [1, 2] and history[-1]["val_accuracy"] > 0.5
    assert seed["optimizer"]["optimizer_class"] == "torch.optim.adamw.AdamW"  # the module's configure_optimizers


def test_an_interrupted_lightning_seed_resumes_exactly(setup, monkeypatch):
    """Killed in its second epoch, the fp16 seed resumes from Lightning's checkpoint of epoch 1 (weights, AdamW's
    moments, the loss scale, the schedule) and ends bitwise equal to the run that never stopped."""
    params, data_dir, root = setup
    whole = _arm("fp16", params, data_dir, root, "whole")
    interrupted_at_epoch_log(monkeypatch, 2, lambda: _arm("fp16", params, data_dir, root, "cut"))
    kept = root / "cut" / ".resume" / "fp16"
    # The resume file names the Lightning checkpoint of its own last epoch (the 2nd epoch's, written before the
    # interruption, is not the one it goes with).
    resume_file = checkpoint.load(kept / "seed0.pt")
    assert resume_file["framework_checkpoint"] == "seed0.epoch1.framework.ckpt"
    assert (kept / resume_file["framework_checkpoint"]).exists()
    assert len(checkpoint.load(kept / "seed0.pt")["meta"]["resume"]["records"]) == 1
    resumed = _arm("fp16", params, data_dir, root, "cut")
    a = checkpoint.load(ArmFiles(root / "whole" / "fp16").checkpoint(0))["model"]
    b = checkpoint.load(ArmFiles(root / "cut" / "fp16").checkpoint(0))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["seeds"]["0"]["final"]["val_loss"] == whole["seeds"]["0"]["final"]["val_loss"]
    assert not kept.exists()


@pytest.mark.parametrize("arm", ["bf16", "fp16"])
def test_a_module_that_turns_autocast_off_is_refused_naming_its_line(setup, arm):
    params, data_dir, root = setup
    raw = params.to_dict()
    raw["train"]["model"] = f"{EXAMPLE}:PinnedToFloat32"
    source = (ROOT / "examples" / "lightning_classifier.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "return self.net(x.float())" in text)
    with pytest.raises(AmpbenchError, match=rf"^the {arm} arm trained in float32: autocast was off around net\.0 "
                                            rf".*\(examples/lightning_classifier\.py:{line}\)$"):
        _arm(arm, validate(raw), data_dir, root, "pinned")
    assert not (root / "pinned").exists()  # refused before anything was written


BAD_MODULES = '''
import torch
from examples.lightning_classifier import DigitsClassifier, DigitsData


class NoLoss(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        return None


class LossUnnamed(DigitsClassifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"total": torch.nn.functional.cross_entropy(self(x), y)}


class HalfWeights(DigitsClassifier):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.net.to(torch.bfloat16)

    def forward(self, x):
        return self.net(x.to(torch.bfloat16)).float()


class SeededSplit(DigitsData):
    def setup(self, stage=None):
        super().setup(stage)
        self.test = torch.utils.data.Subset(self.test, torch.randperm(len(self.test))[:200].tolist())
'''


@pytest.mark.parametrize("model, arm, error, match", [
    ("NoLoss", "fp32", AmpbenchError, r"^train\.model: training_step returned None; it must return the loss"),
    ("LossUnnamed", "fp32", ModelError, r"^Lightning refused train\.model LossUnnamed: .*'loss'"),
    ("HalfWeights", "fp32", AmpbenchError, r"^the fp32 arm trained with bfloat16 weights: net\.0's weights are "
                                           r"bfloat16, not float32"),
    ("nowhere:Module", "fp32", ModelError, r"^train\.model 'nowhere:Module': cannot import nowhere"),
])
def test_bad_lightning_code_is_one_line_and_writes_nothing(setup, monkeypatch, model, arm, error, match):
    params, data_dir, root = setup
    (root / "bad_lightning.py").write_text(BAD_MODULES)
    monkeypatch.syspath_prepend(str(root))
    raw = params.to_dict()
    raw["train"]["model"] = model if ":" in model else f"bad_lightning:{model}"
    with pytest.raises(error, match=match):
        _arm(arm, validate(raw), data_dir, root, "bad")
    assert not (root / "bad" / arm / "summary.json").exists()
    # The refused step left nothing behind: the preflight's FLOP counter (a dispatch mode) once stayed pushed, and
    # every later torch call of the process ran under it (torch.compile refused, a worker crashed).
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None


def test_a_test_split_that_moves_with_the_seed_is_refused(setup, monkeypatch):
    params, _, root = setup
    (root / "bad_lightning.py").write_text(BAD_MODULES)
    monkeypatch.syspath_prepend(str(root))
    raw = params.to_dict()
    raw["prepare"]["dataset"] = "bad_lightning:SeededSplit"
    params = validate(raw)
    data_dir = root / "seeded"
    save_prepared(prepare(params.prepare, root / "raw"), data_dir)
    with pytest.raises(DataError, match="the test split differs from the one prepare read when seed 0 is set"):
        _arm("fp32", params, data_dir, root, "moving")


OVERFLOWING = '''
import torch
from torch import nn

from examples.lightning_classifier import DigitsClassifier
from examples.overflow_model import Gain


class Overflowing(DigitsClassifier):
    """examples/overflow_model.py's planted float16 overflow as a Lightning module: a gain of 10^5 before a
    LayerNorm."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.GELU(), Gain(1e5), nn.LayerNorm(32),
                                 nn.GELU(), nn.Linear(32, 10))
'''


def test_an_overflowing_lightning_module_diverges_naming_its_module(setup, monkeypatch):
    """The numerics a built-in task gets, where Lightning's hooks reach: fp16 steps overflow in the planted gain,
    Lightning's GradScaler skips them, the sampled step that sees the skips hooks the next steps, which name the
    module, and the divergence guard stops the seed (its float32 fix with it)."""
    import mlflow

    params, data_dir, root = setup
    (root / "overflowing.py").write_text(OVERFLOWING)
    monkeypatch.syspath_prepend(str(root))
    raw = params.to_dict()
    raw["train"].update({"model": "overflowing:Overflowing", "model_code": str(root / "overflowing.py"),
                         "model_args": {}})
    params = validate(raw)
    fp16 = _arm("fp16", params, data_dir, root, "run")["seeds"]["0"]
    assert re.match(r"fp16: step \d+: loss scale collapsed to [\d.]+ \(< 1\): fp16 overflows on every step",
                    fp16["diverged"]), fp16["diverged"]
    assert fp16["first_nonfinite"]["module"] == "net.3" and fp16["first_nonfinite"]["phase"] == "forward"
    assert re.search(r"; first non-finite output in module 'net\.3' \(Gain\) at step \d+, loss scale \d+$",
                     fp16["diverged"]), fp16["diverged"]
    assert "net.3" in fp16["fix"]
    assert mlflow.get_run(fp16["run_id"]).info.status == "FAILED"


def test_a_lightning_language_model_is_judged_on_its_loss_per_token(tmp_path, tiny_params, mlflow_store):
    """examples/lightning_lm.py: a datamodule of token sequences and a causal transformer; trained through Lightning
    and evaluated by the language-model task, sequence by sequence."""
    from ampbench.stages.evaluate import evaluate_arms

    raw = lightning_params(tiny_params, task="language_model", model="examples.lightning_lm:DigitsLM",
                           model_args={"width": 32, "depth": 1}, epochs=1, seeds=[0], precisions=["fp32", "bf16"])
    raw["prepare"]["dataset"] = "examples.lightning_lm:DigitsTokens"
    params = validate(raw)
    data_dir = tmp_path / "prepared"
    save_prepared(prepare(params.prepare, tmp_path / "raw"), data_dir)
    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["kind"] == "inputs" and meta["vocab_size"] == 17 and meta["input_shape"] == [63]
    for arm in ("fp32", "bf16"):
        train_arm(arm, params, data_dir, tmp_path / "models" / arm, tmp_path, {},
                  resume_dir=tmp_path / ".resume" / arm, code_version="test")
    evaluate_arms(params, data_dir, tmp_path / "models", tmp_path / "reports", tmp_path, {})
    report = (tmp_path / "reports" / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| bf16 |"))
    assert "Δloss, nats/token" in report and "test sequences" in report
    assert row.split("|")[2].strip() in ("**not worse**", "**inconclusive**", "**worse**"), row
    summary = json.loads((tmp_path / "models" / "bf16" / "summary.json").read_text())
    assert summary["seeds"]["0"]["framework"]["compute_dtypes"] == ["bfloat16"]


def test_importing_ampbench_loads_no_framework():
    """Lightning, transformers and accelerate are imported only when train.framework names one: not by the
    library, nor by the stages' modules."""
    code = ("import sys, ampbench, ampbench.stages.train, ampbench.stages.speed, ampbench.stages.evaluate, "
            "ampbench.stages.framework, ampbench.data.user_data; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'lightning', 'transformers', 'accelerate'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_the_report_says_what_to_set_in_the_framework():
    from ampbench.config.arms import ARMS, adoption_code

    assert adoption_code(ARMS["bf16"], "cuda", "lightning") == 'trainer = L.Trainer(..., precision="bf16-mixed")'
    assert "MixedPrecision(\"16-mixed\", \"cpu\"" in adoption_code(ARMS["fp16"], "cpu", "lightning")
    assert adoption_code(ARMS["fp16"], "cuda", "hf_trainer") == "args = TrainingArguments(..., fp16=True)"
    assert adoption_code(ARMS["tf32"], "cuda", "hf_trainer") == "args = TrainingArguments(..., tf32=True)"
    assert adoption_code(ARMS["bf16_pure"], "cuda", "lightning") == ""


def test_dvc_exp_run_measures_the_lightning_job(tmp_path, tiny_params):
    """The docs' path for a Lightning job: the workspace's params as a user has them, and `dvc exp run -S ...`
    naming the module and the datamodule; every arm trains through Lightning and the report carries its verdicts,
    speeds and runs."""
    tiny_params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "repo", tiny_params)
    sets = [f"prepare.dataset={EXAMPLE}:DigitsData", "prepare.dataset_code=examples", "prepare.max_train=null",
            "train.framework=lightning", f"train.model={EXAMPLE}:DigitsClassifier", "train.model_code=examples",
            "+train.model_args.channels=4", "train.precisions=[fp32,fp16,bf16]", "train.seeds=[0]",
            "train.epochs=2", "speed.rounds=2", "speed.steps=6", "speed.window=3", "speed.warmup_steps=1",
            "speed.seconds_per_arm=1.5"]
    run_ok([str(repo / ".venv" / "bin" / "dvc"), "exp", "run", *[a for s in sets for a in ("-S", s)]], repo, env)
    report = (repo / "reports" / "report.md").read_text()
    for arm in ("fp16", "bf16"):
        row = next(line for line in report.splitlines() if line.startswith(f"| {arm} |"))
        cells = [c.strip() for c in row.split("|")]
        assert cells[2] in ("**not worse**", "**inconclusive**", "**worse**"), row  # a verdict, not skipped
        assert re.fullmatch(r"[\d.]+× \[[\d.]+, [\d.]+\]( unstable)?", cells[4]), row  # speed × fp32, its interval
    assert f"{EXAMPLE}:DigitsClassifier" in report
    summary = json.loads((repo / "models" / "fp16" / "summary.json").read_text())
    assert summary["seeds"]["0"]["framework"]["precision"] == "16-mixed"
    assert ("**fp16**: " in report and "Lightning precision 16-mixed: matmuls and convolutions computed in float16 "
            "(autocast float16), weights float32, gradients float32" in report)
    assert summary["model"]["args"] == {"channels": 4}
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string=ARM_RUNS)
    assert sorted(runs["tags.precision"]) == ["bf16", "fp16", "fp32"]
    assert set(runs["status"]) == {"FINISHED"}
    fp16 = runs[runs["tags.precision"] == "fp16"]
    assert set(fp16["tags.framework.precision"]) == {"16-mixed"} and set(fp16["tags.framework.compute_dtypes"]) == {
        "float16"}


def test_fix_searches_a_lightning_job(setup, monkeypatch):
    """examples/lightning_classifier.py:OffsetClassifier, the planted case of `ampbench fix` in a LightningModule:
    bf16 trains it to chance with every value finite. The ranking runs on the module (not on its ``net``, which
    holds all of it), each trial trains through Lightning's Trainer with the set kept in float32, and the answer,
    with ``net.coords``, is confirmed on a fresh seed and timed through the same Trainer."""
    from click.testing import CliRunner

    from ampbench.cli import main as ampbench
    from test_cli import _stage

    params, data_dir, root = setup
    raw = params.to_dict()
    raw["train"].update({"model": f"{EXAMPLE}:OffsetClassifier", "precisions": ["fp32", "bf16"]})
    raw["speed"] = QUICK_SPEED
    params = validate(raw)
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    (root / "data").mkdir()
    (root / "data" / "prepared").symlink_to(data_dir, target_is_directory=True)
    for arm in ("fp32", "bf16"):
        train_arm(arm, params, data_dir, root / "models" / arm, root, {}, resume_dir=root / ".resume" / arm)
    monkeypatch.setenv("DVC_ROOT", str(root))
    result = CliRunner().invoke(_stage("evaluate"), ["--params", str(root / "params.yaml"), "--data", str(data_dir),
                                                     "--models", str(root / "models"), "--reports",
                                                     str(root / "reports")])
    assert result.exit_code == 0, result.output
    assert json.loads((root / "reports" / "comparison.json").read_text())["bf16"]["not_worse"] == "worse"
    ranked = CliRunner().invoke(ampbench, ["sensitivity", "bf16", "--root", str(root), "--top", "20"])
    assert ranked.exit_code == 0 and "| net.coords | Coordinates |" in ranked.output.splitlines()[4], ranked.output
    assert "| net |" not in ranked.output  # the wrapper of the whole model is no candidate
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    lines = [line for line in result.output.splitlines() if not line.startswith("[")]
    assert lines[1].startswith('trial 1: ["net.coords"] kept in float32, seeds [0]: '), lines
    adopt = next(i for i, line in enumerate(lines) if line.endswith("Adopt it:"))
    assert '"net.coords"' in lines[adopt + 1], lines
    assert lines[adopt + 2].startswith("Speed × fp32, timed together (speed.* sizes): bf16 as it was "), lines
