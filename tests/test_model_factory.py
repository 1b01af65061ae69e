"""Bring your own model: the three forms of train.model, the dry run that refuses a model that does not fit the
data, and what every run records about the model."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from ampbench.config.user_code import require_tracked
from ampbench.config.validation import validate
from ampbench.errors import ModelError, ParamsError
from ampbench.models.factory import ModelSpec, build, inspect_model
from conftest import ROOT
from test_cli import _stage

DIGITS = torch.randn(2, 1, 8, 8)  # the default data's shape: 1 channel, 8×8


@pytest.mark.parametrize("name, args, kind", [
    ("vit_tiny", {"depth": 2}, "builtin"),
    ("torchvision.mobilenet_v3_small", {}, "torchvision"),  # a 3-channel stem adapted to 1 channel
    ("torchvision.resnet18", {}, "torchvision"),
    ("examples.my_model:build", {"channels": 16}, "factory"),
])
def test_each_form_builds_and_is_identified(name, args, kind, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # factories import from the project root, as the stages arrange
    identity = inspect_model(ModelSpec(name, args=args), DIGITS, 10)
    model = build(ModelSpec(name, args=args), (1, 8, 8), 10)
    assert identity["kind"] == kind and identity["args"] == args
    assert identity["parameters"] == sum(p.numel() for p in model.parameters())
    assert identity["flops_per_sample"] > 0


def test_flops_are_counted_by_torch():
    """small_cnn width 4 on 1×8×8: three 3×3 convs (1→4, 4→8 at 8×8; 8→8 at 4×4) and a linear 8→10, 2 FLOPs a MAC."""
    identity = inspect_model(ModelSpec("small_cnn", width=4), DIGITS, 10)
    macs = 64 * 4 * 9 * 1 + 64 * 8 * 9 * 4 + 16 * 8 * 9 * 8 + 8 * 10
    assert identity["flops_per_sample"] == 2 * macs


def test_the_dry_run_leaves_random_state_alone():
    before = torch.get_rng_state()
    inspect_model(ModelSpec("small_cnn"), DIGITS, 10)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("name, expected", [
    ("vgg", "'vgg' is none of: small_cnn | resnet18 | mlp | vit_tiny | gpt | torchvision.<name> | "
            "package.module:callable"),
    ("torchvision.resnet1", "torchvision has no classification model 'resnet1' (closest: torchvision.resnet18"),
    ("torchvision.fasterrcnn_resnet50_fpn", "torchvision has no classification model"),  # detection: not a classifier
])
def test_bad_model_names_are_params_errors(name, expected):
    with pytest.raises(ParamsError, match="^train.model: ") as err:
        validate({"train": {"model": name}})
    assert expected in str(err.value)


def test_width_is_for_built_ins_only():
    with pytest.raises(ParamsError, match="train.width: sizes the built-in models only"):
        validate({"train": {"model": "torchvision.resnet18", "width": 32}})


FACTORIES = '''
import torch
from torch import nn

number = 3

def not_a_module(shape, classes):
    return {"weights": torch.zeros(3)}

def wrong_output(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(shape[0] * shape[1] * shape[2], classes + 1))

def too_small(shape, classes):  # a 16×16 kernel: needs inputs of at least 16×16
    return nn.Sequential(nn.Conv2d(shape[0], 4, 16), nn.Flatten(), nn.Linear(4, classes))
'''


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    """An importable folder with a module of faulty factories and one that fails to import."""
    folder = tmp_path_factory.mktemp("factories")
    (folder / "faulty.py").write_text(FACTORIES)
    (folder / "broken.py").write_text("import a_package_this_machine_lacks\n")
    return folder


FACTORY_CASES = [
    ("import-error", "broken:build", "cannot import broken (ModuleNotFoundError: No module named "
                                     "'a_package_this_machine_lacks')"),
    ("missing-attribute", "faulty:nope", "faulty has no attribute 'nope'"),
    ("not-callable", "faulty:number", "faulty.number is a int, not a callable"),
    ("returns-no-module", "faulty:not_a_module", "returned a dict, not a torch.nn.Module"),
    ("wrong-output-shape", "faulty:wrong_output", "returns torch.float32 of shape (2, 11) in training mode; expected "
                                                  "logits of shape (2, 10)"),
    ("input-too-small", "faulty:too_small", "on input (1, 8, 8): the forward pass failed in training mode"),
    ("torchvision-input-too-small", "torchvision.squeezenet1_0", "Output size is too small"),
]


@pytest.mark.parametrize("case", FACTORY_CASES, ids=[c[0] for c in FACTORY_CASES])
def test_models_that_do_not_fit_fail_before_any_work(case, factories, monkeypatch):
    _, name, expected = case
    monkeypatch.syspath_prepend(str(factories))
    with pytest.raises(ModelError) as err:
        inspect_model(ModelSpec(name), DIGITS, 10)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_factory_must_be_tracked_by_model_code(factories, monkeypatch):
    monkeypatch.syspath_prepend(str(factories))
    spec = "faulty:wrong_output"
    require_tracked("train.model", spec, "faulty.py", factories)
    require_tracked("train.model", spec, ".", factories)  # the folder holding it also counts
    require_tracked("train.model", spec, str(factories / "faulty.py"), ROOT)  # an absolute path too
    with pytest.raises(ParamsError, match=r"^train.model_code: src/ampbench/models/builtins.py does not hold "
                                          r"faulty.py, which defines faulty:wrong_output; set train.model_code: "
                                          r"faulty.py so that "):
        require_tracked("train.model", spec, "src/ampbench/models/builtins.py", factories)
    require_tracked("train.model", "torchvision.resnet18", "anything", ROOT)  # only factories are checked


def test_editing_the_factory_changes_the_code_version(tmp_path, monkeypatch):
    from _common import code_version

    (tmp_path / "m.py").write_text("def build(shape, classes): ...\n")
    before = code_version(str(tmp_path / "m.py"))
    assert code_version(str(tmp_path)) != code_version("src/ampbench/models/builtins.py")
    (tmp_path / "m.py").write_text("def build(shape, classes): return None\n")
    assert code_version(str(tmp_path / "m.py")) != before
    monkeypatch.chdir(tmp_path)  # a relative model_code is relative to the project, whatever the working folder
    builtins = "src/ampbench/models/builtins.py"
    assert code_version(builtins) == code_version(str(ROOT / builtins))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Tiny 1-channel 16×16 synthetic data (120 images, 4 classes), prepared once."""
    from conftest import prepare_synthetic

    return prepare_synthetic(tmp_path_factory.mktemp("synthetic"), {
        "synthetic": {"image_size": 16, "channels": 1, "classes": 4, "count": 120, "noise": 1.0}})


@pytest.mark.parametrize("model, args", [("torchvision.mobilenet_v3_small", {}),
                                         ("examples.my_model:build", {"channels": 16})])
def test_your_model_trains_and_is_evaluated(model, args, synthetic, tmp_path, mlflow_store, write_params):
    """A torchvision classifier by name and the example factory, one epoch on tiny 1-channel data through the train
    and evaluate stages (test_e2e runs the README's factory example through `dvc exp run`)."""
    import mlflow

    params, data = synthetic
    params = {**params, "train": {**params["train"], "model": model, "model_args": args, "precisions": ["fp32"],
                                  "model_code": "examples/my_model.py" if ":" in model
                                  else "src/ampbench/models/builtins.py"}}
    path = str(write_params(params))
    out = tmp_path / "models"
    result = CliRunner().invoke(_stage("train"), ["--precision", "fp32", "--params", path, "--data", str(data),
                                                  "--out", str(out / "fp32"), "--resume-dir", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output + str(result.exception)
    summary = json.loads((out / "fp32" / "summary.json").read_text())
    assert summary["model"]["name"] == model and summary["model"]["parameters"] > 0
    result = CliRunner().invoke(_stage("evaluate"), ["--params", path, "--data", str(data), "--models", str(out),
                                                     "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert f"Model `{model}`" in (tmp_path / "reports" / "report.md").read_text()
    mlflow.set_tracking_uri(mlflow_store)
    (run,) = [r for r in mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list")
              if r.info.run_name == "fp32-seed0"]
    assert run.data.params["train.model"] == model
    assert int(run.data.params["model.parameters"]) == summary["model"]["parameters"]
    assert int(run.data.params["model.flops_per_sample"]) == summary["model"]["flops_per_sample"] > 0



def test_a_backward_without_a_deterministic_kernel_is_caught_before_any_work(factories, monkeypatch):
    """As AdaptiveAvgPool2d's backward on CUDA under train.deterministic (simulated here on the CPU)."""
    (factories / "nondeterministic.py").write_text(
        "import torch\n"
        "from torch import nn\n"
        "class Guarded(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x.clone()\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        if torch.are_deterministic_algorithms_enabled():\n"
        "            raise RuntimeError('guarded_backward does not have a deterministic implementation')\n"
        "        return g\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, shape, classes):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(shape[0] * shape[1] * shape[2], classes)\n"
        "    def forward(self, x):\n"
        "        return Guarded.apply(self.fc(x.flatten(1)))\n")
    monkeypatch.syspath_prepend(str(factories))
    inspect_model(ModelSpec("nondeterministic:Net"), DIGITS, 10)  # fine with determinism off (the default here)
    torch.use_deterministic_algorithms(True)  # conftest puts the flag back afterwards
    with pytest.raises(ModelError, match=r"the backward pass failed \(RuntimeError: guarded_backward does not have "
                                         r"a deterministic implementation\); set train.deterministic: false"):
        inspect_model(ModelSpec("nondeterministic:Net"), DIGITS, 10)
