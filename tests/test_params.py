"""params.yaml schema: defaults are valid, each bad value gets one line naming the key, and the files that repeat
the schema (params.yaml, dvc.yaml's params lists) agree with it."""

import dataclasses

import pytest
import yaml

from ampbench.config import arms
from ampbench.config.params import Params
from ampbench.config.sync import render, render_dvc_yaml, schema, stage_params
from ampbench.config.validation import load_params, validate
from ampbench.errors import ParamsError
from conftest import ROOT


def _committed_params() -> str | None:
    import subprocess

    done = subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def test_params_yaml_is_the_schema_rendered():
    """params.yaml holds exactly the schema's defaults, in its order, with its docs as comments: in the workspace,
    or as committed when a `dvc exp run -S` has left its values in the workspace's copy (a user's experiment must
    not fail the tests). A schema change without `make params` fails both."""
    rendered = render(Params())
    assert rendered in ((ROOT / "params.yaml").read_text(), _committed_params()), (
        "params.yaml is out of date: run `make params`")
    assert validate(yaml.safe_load(rendered)) == Params()


def test_dvc_yaml_params_lists_are_derived_from_the_schema():
    text = (ROOT / "dvc.yaml").read_text()
    assert text == render_dvc_yaml(text), "dvc.yaml's params lists are out of date: run `make params`"
    # The train stages do not depend on the list of arms (dvc.yaml's matrix makes one stage per entry)...
    assert "train.precisions" not in stage_params("train") and "train.precisions" in stage_params("evaluate")
    # ...nor on the progress bar; evaluate reads no training knob but the device, the seeds, the task (its code and
    # its block size: it cuts the test text as training did), the model's code (it rebuilds the trained models),
    # the batch size (a step's time, for time to fp32's quality) and the modules kept in float32 (it predicts as
    # the arm trained).
    assert not [k for s in ("prepare", "train", "evaluate") for k in stage_params(s) if k == "train.progress"]
    assert [k for k in stage_params("evaluate") if k.startswith("train.")] == [
        "train.precisions", "train.seeds", "train.device", "train.task", "train.task_code", "train.block_size",
        "train.model_code", "train.batch_size", "train.fp32_modules"]
    assert "train.eval_every" in stage_params("train") and "train.eval_every" not in stage_params("speed")


def test_every_key_is_documented():
    undocumented = [key.path for section in schema() for key in section.leaves() if not key.doc]
    assert undocumented == []


def test_precision_names_come_from_the_arm_registry():
    assert validate({"train": {"precisions": list(arms.NAMES)}}).train.precisions == list(arms.NAMES)
    assert Params().train.precisions == list(arms.MAIN)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"train": {"epoch": 3}}, "train.epoch: unknown key (a typo?); did you mean train.epochs?"),
        ({"prepare": {"synthetic": {"clases": 3}}}, "prepare.synthetic.clases: unknown key (a typo?); did you mean "
         "prepare.synthetic.classes?"),
        ({"trian": {}}, "trian: unknown key (a typo?); did you mean train?"),
        ({"train": {"lr": 0}}, "train.lr: Input should be greater than 0"),
        ({"train": {"lr": "fast"}}, "train.lr:"),
        ({"train": {"epochs": 0}}, "train.epochs:"),
        ({"train": {"batch_size": -1}}, "train.batch_size:"),
        ({"train": {"precisions": []}}, "train.precisions:"),
        ({"train": {"precisions": ["fp32", "fp8"]}}, "train.precisions.1:"),
        ({"train": {"precisions": ["fp16", "bf16"]}}, "train.precisions: must include the fp32 baseline"),
        ({"train": {"precisions": ["fp32", "fp32"]}}, "train.precisions: entries must be unique"),
        ({"train": {"model": "vgg"}}, "train.model:"),
        ({"train": {"optimizer": "lion"}}, "train.optimizer:"),
        ({"prepare": {"dataset": "imagenet"}}, "prepare.dataset:"),
        ({"train": {"device": "tpu"}}, "train.device:"),
        ({"train": {"cudnn_benchmark": True}}, "train.cudnn_benchmark: picks kernels by timing"),
        ({"train": {"grad_scaler": {"backoff_factor": 2}}}, "train.grad_scaler.backoff_factor:"),
        ({"train": {"nproc_per_node": 3, "batch_size": 64}}, "train.batch_size: 64 does not split evenly"),
        ({"evaluate": {"margin": {"accuracy_pp": -1}}}, "evaluate.margin.accuracy_pp: Input should be greater than "
                                                         "or equal to 0, or Input should be 'auto' (got -1)"),
        ({"evaluate": {"margin": {"loss": "sometimes"}}}, "evaluate.margin.loss:"),
        ({"train": {"seeds": [0]}, "evaluate": {"margin": {"accuracy_pp": "auto"}}},
         "evaluate.margin.accuracy_pp: auto derives the margin from fp32's seed-to-seed variation"),
        ({"train": {"seeds": [0, 1]}, "evaluate": {"sequential": {"max_seeds": 6}}},
         "train.seeds: 2 seeds is no look of the sequential design from evaluate.sequential.min_seeds=3 to "
         "max_seeds=6"),
        ({"train": {"seeds": [0, 1, 2]}, "evaluate": {"sequential": {"max_seeds": 6}, "margin": {"loss": "auto"}}},
         "evaluate.margin.loss: auto moves with every look of a sequential design; set a number"),
        ({"evaluate": {"sequential": {"spending": "haybittle"}}}, "evaluate.sequential.spending:"),
        ({"evaluate": {"sequential": {"min_seeds": 1}}}, "evaluate.sequential.min_seeds: Input should be greater"),
    ],
)
def test_bad_params_name_the_key(raw, expected):
    with pytest.raises(ParamsError) as err:
        validate(raw)
    msg = str(err.value)
    assert expected in msg
    assert "\n" not in msg


def test_strings_from_dvc_overrides_are_cast():
    # `dvc exp run -S train.lr=1e-3` can arrive as the string "1e-3" (YAML 1.1); it must become a float.
    p = validate({"train": {"lr": "1e-3", "epochs": "2"}})
    assert p.train.lr == pytest.approx(1e-3)
    assert p.train.epochs == 2
    margin = validate({"evaluate": {"margin": {"accuracy_pp": "auto", "loss": "0.05"}}}).evaluate.margin
    assert (margin.accuracy_pp, margin.loss) == ("auto", 0.05)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ParamsError, match="no such params file"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_params_are_frozen():
    p = Params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.train.lr = 1.0


def test_sync_keeps_values_and_adds_comments(tmp_path):
    from ampbench.config.sync import sync

    (tmp_path / "params.yaml").write_text("train:\n  epochs: 3\n  lr: 1e-3\n")
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    assert sync(tmp_path, write=False) == [tmp_path / "params.yaml"]
    sync(tmp_path)
    p = load_params(tmp_path / "params.yaml")
    assert (p.train.epochs, p.train.lr, p.train.batch_size) == (3, 0.001, Params().train.batch_size)
    assert "epochs: 3                # passes over the training split" in (tmp_path / "params.yaml").read_text()
    assert sync(tmp_path) == []
