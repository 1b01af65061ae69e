"""params.yaml schema: defaults are valid, and each bad value gets one line naming the key."""

import pytest

from ampbench.errors import ParamsError
from ampbench.params import Params, load_params, validate


def test_repo_params_file_is_valid():
    from conftest import ROOT

    p = load_params(ROOT / "params.yaml")
    assert p.train.precisions[0] == "fp32"
    assert p.prepare.dataset == "digits"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"train": {"epoch": 3}}, "train.epoch: unknown key"),
        ({"trian": {}}, "trian: unknown key"),
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
        ({"evaluate": {"margin": {"accuracy_pp": -1}}}, "evaluate.margin.accuracy_pp:"),
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


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ParamsError, match="no such params file"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)


def test_params_are_frozen():
    p = Params()
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        p.train.lr = 1.0
