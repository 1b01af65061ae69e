"""Your Hugging Face Trainer job as it is: examples/hf_trainer_lm.py (a GPT-2-style causal LM from a config, digits
as token sequences) trained by the Trainer under each arm's own flags, read back as it trains, through `dvc exp run`
with the usual report: on the CPU the Trainer's fp16=True trains in float32 (read back in one step, so the arm is
skipped with why), bf16 is judged against fp32 on the loss per token; a model loaded in bfloat16 and a Trainer
reporting to MLflow itself are refused in one line. Skipped where transformers or accelerate is missing, except in
CI (AMPBENCH_REQUIRE_TRANSFORMERS=1)."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
import yaml

if not os.environ.get("AMPBENCH_REQUIRE_TRANSFORMERS"):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")

from ampbench.config.validation import validate  # noqa: E402
from ampbench.data.prepare import prepare, save_prepared  # noqa: E402
from ampbench.errors import ArmUnavailable, ModelError  # noqa: E402
from ampbench.frameworks.readback import ArmMismatch  # noqa: E402
from ampbench.precision.policy import resolve_policy  # noqa: E402
from ampbench.stages.train import train_arm  # noqa: E402
from conftest import ARM_RUNS, QUICK_SPEED, interrupted_at_epoch_log, make_project_repo, run_ok  # noqa: E402

EXAMPLE = "examples.hf_trainer_lm"


def hf_params(base: dict, **train) -> dict:
    params = yaml.safe_load(yaml.safe_dump(base))
    params["prepare"].update({"dataset": f"{EXAMPLE}:build", "dataset_code": "examples", "max_train": None})
    params["train"].update({"framework": "hf_trainer", "task": "language_model", "model": f"{EXAMPLE}:build",
                            "model_code": "examples", "model_args": {"n_embd": 32, "n_layer": 1}, "epochs": 1,
                            **train})
    params["mlflow"]["log_model"] = False
    return params


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_params_module):
    root = tmp_path_factory.mktemp("hf")
    params = validate(hf_params(tiny_params_module, seeds=[0], precisions=["fp32", "fp16", "bf16"]))
    save_prepared(prepare(params.prepare, root / "raw"), root / "prepared")
    return params, root


def _arm(arm, params, root, name="run"):
    return train_arm(arm, params, root / "prepared", root / name / arm, root, {},
                     resume_dir=root / name / ".resume" / arm, code_version="test")


def test_each_arm_is_the_trainers_own_flag():
    from ampbench.frameworks.hf import flags, precision_name

    cpu = torch.device("cpu")
    assert flags(resolve_policy("fp16", cpu)) == {"fp16": True, "bf16": False, "tf32": None}
    assert precision_name(resolve_policy("bf16", cpu)) == "bf16=True"
    assert precision_name(resolve_policy("fp32", cpu)) == "fp16=False, bf16=False"
    for arm in ("bf16_pure", "bf16_sr", "fp8_rowwise", "fp16_noscaler"):
        with pytest.raises(ArmUnavailable):
            flags(resolve_policy(arm, cpu))


def test_a_trainer_of_the_users_own_class_is_recognised():
    from transformers import Trainer

    from ampbench.data.datamodule import is_hf_trainer

    mine = type("MyTrainer", (Trainer,), {"__module__": "my_project.training"})
    assert is_hf_trainer(object.__new__(mine)) and is_hf_trainer(object.__new__(Trainer))
    assert not is_hf_trainer(object())


def test_the_prepared_data_is_the_trainers_own(prepared):
    params, root = prepared
    meta = json.loads((root / "prepared" / "meta.json").read_text())
    # Fixed-length blocks of 64 tokens become (the first 63, the next 63); the eval set is val and test alike.
    assert meta["kind"] == "inputs" and meta["input_shape"] == [63] and meta["vocab_size"] == 17
    assert meta["sizes"] == {"train": 1400, "val": 397, "test": 397}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's case: the Trainer applies fp16=True on CUDA")
def test_dvc_exp_run_measures_the_trainer_job(tmp_path, tiny_params):
    """The docs' path for a Trainer job, as a user runs it: `dvc exp run -S ...` naming the script's ``build``. On
    the CPU the Trainer's fp16=True trains in float32 (read back in one step: the arm is skipped with why); bf16 is
    judged against fp32 on the loss per token, timed by the speed stage, and its runs carry what ran."""
    import mlflow

    tiny_params["mlflow"]["log_model"] = False
    repo, env = make_project_repo(tmp_path / "repo", tiny_params)
    sets = [f"prepare.dataset={EXAMPLE}:build", "prepare.dataset_code=examples", "prepare.max_train=null",
            "train.framework=hf_trainer", "train.task=language_model", f"train.model={EXAMPLE}:build",
            "train.model_code=examples", "+train.model_args.n_embd=32", "+train.model_args.n_layer=1",
            "train.precisions=[fp32,fp16,bf16]", "train.seeds=[0]", "train.epochs=1", "speed.rounds=2",
            "speed.steps=4", "speed.window=2", "speed.warmup_steps=1", "speed.seconds_per_arm=1.5"]
    run_ok([str(repo / ".venv" / "bin" / "dvc"), "exp", "run", *[a for s in sets for a in ("-S", s)]], repo, env)
    report = (repo / "reports" / "report.md").read_text()
    rows: dict[str, str] = {}  # each arm's row in the summary table (the report's first)
    for line in report.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split("|")[1].strip(), line)
    assert "**skipped**" in rows["fp16"] and "Hugging Face Trainer, fp16=True" in rows["fp16"]
    cells = [c.strip() for c in rows["bf16"].split("|")]
    assert cells[2] in ("**not worse**", "**inconclusive**", "**worse**"), rows["bf16"]  # a verdict
    assert re.fullmatch(r"[\d.]+× \[[\d.]+, [\d.]+\]( unstable)?", cells[4]), rows["bf16"]  # speed × fp32
    assert "Δloss, nats/token" in report
    assert "Hugging Face Trainer precision bf16=True: matmuls and convolutions computed in bfloat16" in report
    fp16 = json.loads((repo / "models" / "fp16" / "summary.json").read_text())
    assert fp16["skipped"].startswith("the fp16 arm trained in float32: autocast was off around transformer.h.0")
    assert "the framework did not apply the arm's flag on cpu" in fp16["skipped"]
    speed = json.loads((repo / "reports" / "interleaved.json").read_text())  # timed through the Trainer, fp16 not
    assert speed["arms"]["bf16"]["speedup_vs_fp32"] > 0
    assert speed["skipped"]["fp16"].startswith("the fp16 arm trained in float32")
    bf16 = json.loads((repo / "models" / "bf16" / "summary.json").read_text())
    assert bf16["framework"]["precision"] == "bf16=True" and bf16["framework"]["compute_dtypes"] == ["bfloat16"]
    mlflow.set_tracking_uri(f"sqlite:///{repo / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string=ARM_RUNS)
    assert sorted(runs["tags.precision"]) == ["bf16", "fp32"] and set(runs["status"]) == {"FINISHED"}
    assert set(runs[runs["tags.precision"] == "bf16"]["tags.framework.precision"]) == {"bf16=True"}


def test_an_interrupted_seed_resumes_from_the_trainers_checkpoint_exactly(prepared, monkeypatch, mlflow_store):
    """Killed as its 2nd epoch is logged, the seed resumes from the Trainer's own checkpoint of epoch 1 (weights,
    AdamW's moments, the schedule, the random states) and ends bitwise equal to the run that never stopped."""
    from ampbench.config.layout import ArmFiles
    from ampbench.training import checkpoint

    params, root = prepared
    raw = params.to_dict()
    raw["train"].update({"epochs": 2, "seeds": [0]})
    params = validate(raw)
    whole = _arm("fp32", params, root, "whole")
    interrupted_at_epoch_log(monkeypatch, 2, lambda: _arm("fp32", params, root, "cut"))
    kept = root / "cut" / ".resume" / "fp32"
    assert checkpoint.load(kept / "seed0.pt")["framework_checkpoint"] == "seed0.epoch1.framework.ckpt"
    assert (kept / "seed0.epoch1.framework.ckpt" / "trainer_state.json").exists()
    resumed = _arm("fp32", params, root, "cut")
    a = checkpoint.load(ArmFiles(root / "whole" / "fp32").checkpoint(0))["model"]
    b = checkpoint.load(ArmFiles(root / "cut" / "fp32").checkpoint(0))["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["seeds"]["0"]["final"]["val_loss"] == whole["seeds"]["0"]["final"]["val_loss"]
    assert not kept.exists()


def test_a_model_loaded_in_bfloat16_is_refused(prepared):
    params, root = prepared
    raw = params.to_dict()
    raw["train"]["model"] = f"{EXAMPLE}:build_pinned"
    with pytest.raises(ArmMismatch, match=r"^the fp32 arm trained with bfloat16 weights: .* are bfloat16, not "
                                          r"float32 \(your code casts or loads the model in it\)$"):
        _arm("fp32", validate(raw), root, "pinned")
    assert not (root / "pinned" / "fp32" / "summary.json").exists()


def test_a_trainer_reporting_to_mlflow_itself_is_refused(prepared, monkeypatch):
    params, root = prepared
    (root / "own_mlflow.py").write_text(
        "from examples.hf_trainer_lm import build as base\n"
        "def build(**kw):\n"
        "    t = base(**kw)\n"
        "    t.args.report_to = ['mlflow']\n"
        "    return t\n")
    monkeypatch.syspath_prepend(str(root))
    raw = params.to_dict()
    raw["train"]["model"] = "own_mlflow:build"
    with pytest.raises(ModelError, match=r"report_to=\[..., 'mlflow'\]\) logs runs of its own beside the pipeline's"):
        _arm("fp32", validate(raw), root, "own")


def test_fix_searches_a_trainer_job(prepared, tmp_path, mlflow_store, monkeypatch):
    """examples/hf_trainer_lm.py:build_offset, the planted case of `ampbench fix` in a Trainer job: bf16 loses the
    final hidden states in the origin and is worse by its loss per token, every value finite. The ranking runs on the
    Trainer's model, each trial trains through the Trainer with the set kept in float32, and the answer, with
    ``transformer.ln_f.0``, is confirmed on a fresh seed and timed through the same Trainer."""
    from click.testing import CliRunner

    from ampbench.cli import main as ampbench
    from test_cli import _stage

    params, data = prepared
    raw = params.to_dict()
    raw["train"].update({"model": f"{EXAMPLE}:build_offset", "precisions": ["fp32", "bf16"]})
    raw["speed"] = QUICK_SPEED
    params = validate(raw)
    root = tmp_path
    (root / "params.yaml").write_text(yaml.safe_dump(raw))
    (root / "data").mkdir()
    (root / "data" / "prepared").symlink_to(data / "prepared", target_is_directory=True)
    for arm in ("fp32", "bf16"):
        train_arm(arm, params, data / "prepared", root / "models" / arm, root, {}, resume_dir=root / ".resume" / arm)
    monkeypatch.setenv("DVC_ROOT", str(root))
    result = CliRunner().invoke(_stage("evaluate"), ["--params", str(root / "params.yaml"), "--data",
                                                     str(data / "prepared"), "--models", str(root / "models"),
                                                     "--reports", str(root / "reports")])
    assert result.exit_code == 0, result.output
    assert json.loads((root / "reports" / "comparison.json").read_text())["bf16"]["not_worse"] == "worse"
    result = CliRunner().invoke(ampbench, ["fix", "bf16", "--root", str(root)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    lines = [line for line in result.output.splitlines() if line and not line.startswith(("[", "Writing model"))]
    assert lines[1].startswith('trial 1: ["transformer.ln_f.0"] kept in float32, seeds [0]: not worse (Δloss '), lines
    assert """  .venv/bin/dvc exp run --temp -S 'train.fp32_modules=["transformer.ln_f.0"]'""" in lines, lines
    adopt = lines.index("""  .venv/bin/dvc exp run --temp -S 'train.fp32_modules=["transformer.ln_f.0"]'""")
    assert lines[adopt + 1].startswith("Speed × fp32, timed together (speed.* sizes): bf16 as it was "), lines
