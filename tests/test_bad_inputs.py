"""Bad params and bad environments: each gets exit ≠ 0 and one line naming the problem — no traceback, no new
output files, no MLflow run left RUNNING."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from conftest import ARM_RUNS, TINY, train_fp32_only
from test_cli import _stage


def _set(d: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for key in path:
        d = d.setdefault(key, {})
    d[last] = value


# (id, stage, params changes {dotted key: value}, expected text in the one-line message)
PARAM_CASES = [
    ("typo-key", "train", {"train.epoch": 3}, "train.epoch: unknown key"),
    ("typo-section", "train", {"trian.lr": 1}, "trian: unknown key"),
    ("lr-zero", "train", {"train.lr": 0}, "train.lr: Input should be greater than 0"),
    ("lr-negative", "train", {"train.lr": -0.1}, "train.lr:"),
    ("lr-word", "train", {"train.lr": "fast"}, "train.lr: Input should be a valid number"),
    ("epochs-zero", "train", {"train.epochs": 0}, "train.epochs:"),
    ("batch-zero", "train", {"train.batch_size": 0}, "train.batch_size:"),
    ("batch-one", "train", {"train.batch_size": 1}, "train.batch_size: 1 trains nothing"),
    ("precisions-empty", "train", {"train.precisions": []}, "train.precisions:"),
    ("precision-unknown", "train", {"train.precisions": ["fp32", "fp8"]}, "train.precisions.1:"),
    ("no-baseline", "evaluate", {"train.precisions": ["fp16", "bf16"]}, "must include the fp32 baseline"),
    ("precisions-duplicate", "train", {"train.precisions": ["fp32", "fp32"]}, "entries must be unique"),
    ("model-unknown", "train", {"train.model": "vgg"}, "train.model:"),
    ("torchvision-unknown", "train", {"train.model": "torchvision.resnet1"}, "closest: torchvision.resnet18"),
    ("width-for-torchvision", "train", {"train.model": "torchvision.resnet18", "train.width": 8},
     "train.width: sizes the built-in models only"),
    ("optimizer-unknown", "train", {"train.optimizer": "lion"}, "train.optimizer:"),
    ("dataset-unknown", "prepare", {"prepare.dataset": "imagenet"}, "prepare.dataset:"),
    ("device-unknown", "train", {"train.device": "tpu"}, "train.device:"),
    ("margin-negative", "evaluate", {"evaluate.margin.accuracy_pp": -1}, "evaluate.margin.accuracy_pp:"),
    ("seeds-empty", "train", {"train.seeds": []}, "train.seeds:"),
    ("seed-negative", "train", {"train.seeds": [0, -1]}, "train.seeds.1: Input should be greater than or equal to 0"),
    ("seed-beyond-32-bit", "train", {"train.seeds": [2**32]}, "train.seeds.0: Input should be less than or equal to"),
    ("split-seed-beyond-32-bit", "prepare", {"prepare.seed": 2**40}, "prepare.seed: Input should be less than"),
    ("epochs-absurd", "train", {"train.epochs": 10**9}, "train.epochs: Input should be less than or equal to 100000"),
    ("batch-absurd", "train", {"train.batch_size": 2**40}, "train.batch_size: Input should be less than or equal"),
    ("bins-absurd", "evaluate", {"evaluate.calibration_bins": 10**9}, "evaluate.calibration_bins:"),
    ("init-scale-beyond-fp32", "train", {"train.grad_scaler.init_scale": 1e39}, "train.grad_scaler.init_scale:"),
    ("synthetic-beyond-memory", "prepare", {"prepare.dataset": "synthetic", "prepare.synthetic.count": 10**7,
                                            "prepare.synthetic.image_size": 1024}, "need about"),
    ("seed-word", "train", {"train.seeds": ["a"]}, "train.seeds.0:"),
    ("backoff-above-one", "train", {"train.grad_scaler.backoff_factor": 2}, "train.grad_scaler.backoff_factor:"),
    ("benchmark-with-determinism", "train", {"train.cudnn_benchmark": True}, "train.cudnn_benchmark:"),
    ("weight-decay-negative", "train", {"train.weight_decay": -1}, "train.weight_decay:"),
    ("momentum-above-one", "train", {"train.momentum": 1.5}, "train.momentum:"),
    ("val-fraction-huge", "prepare", {"prepare.val_fraction": 0.9}, "prepare.val_fraction:"),
    ("synthetic-size-zero", "prepare", {"prepare.synthetic.image_size": 0}, "prepare.synthetic.image_size:"),
    ("confidence-one", "evaluate", {"evaluate.confidence": 1.0}, "evaluate.confidence:"),
    ("experiment-empty", "train", {"mlflow.experiment": ""}, "mlflow.experiment:"),
    ("deterministic-word", "train", {"train.deterministic": "maybe"}, "train.deterministic:"),
    ("task-unknown", "train", {"train.task": "regression"}, "train.task: 'regression' is none of"),
    ("language-model-on-images", "train", {"train.task": "language_model", "train.model": "gpt"},
     "prepare.dataset: 'digits' is image data; train.task: language_model trains on text"),
    ("language-model-with-an-image-model", "train", {"train.task": "language_model", "prepare.dataset": "text"},
     "train.model: 'small_cnn' is an image classifier"),
    ("image-option-on-text", "train", {"train.task": "language_model", "prepare.dataset": "text",
                                       "train.model": "gpt", "train.augment": "crop_flip"},
     "train.augment: only means something for images"),
    ("text-for-classification", "prepare", {"prepare.dataset": "text"}, "prepare.dataset: text is for train.task"),
    ("text-option-on-images", "train", {"train.block_size": 32}, "train.block_size: only means something for"),
    ("gpt-for-classification", "evaluate", {"train.model": "gpt"}, "train.model: gpt is a language model"),
    # A YAML boolean where a number belongs: pydantic reads true as 1 (train.epochs: true trained one epoch).
    ("epochs-a-boolean", "train", {"train.epochs": True}, "train.epochs: a boolean where a number belongs"),
    ("seed-a-boolean", "train", {"train.seeds": [0, True]}, "train.seeds.1: a boolean where a number belongs"),
    ("margin-a-boolean", "evaluate", {"evaluate.margin.accuracy_pp": False}, "evaluate.margin.accuracy_pp: a bool"),
    ("cap-a-boolean", "prepare", {"prepare.max_train": True}, "prepare.max_train: a boolean where a number"),
    # A name MLflow's experiments table cannot hold was accepted, then blamed on the store.
    ("experiment-name-beyond-the-store", "train", {"mlflow.experiment": "x" * 10_000},
     "mlflow.experiment: String should have at most 256 characters (got 'xxx"),
    # Free-form values the runs log as params, beyond what MLflow keeps: failed mid-run, blaming the store.
    ("model-arg-beyond-mlflow", "train", {"train.model_args": {"vocab": "w" * 7000}},
     "train.model_args.vocab: 7,000 characters once logged; MLflow keeps params of at most 6,000"),
    ("model-arg-key-beyond-mlflow", "train", {"train.model_args": {"k" * 300: 1}},
     "a params key of 317 characters; MLflow keeps at most 250"),
    # Rules between keys that a later stage refused after every train stage had run: the check stage says them.
    ("speed-steps-below-two-windows", "check", {"speed.steps": 10, "speed.window": 10},
     "speed.steps: 10 is less than 2 × the window (10)"),
    ("fp8-on-cuda-uncompiled", "check", {"train.device": "cuda", "train.precisions": ["fp32", "fp8_rowwise"],
                                         "train.model": "mlp"}, "train.compile: fp8_rowwise on CUDA needs"),
    ("margin-auto-one-seed", "check", {"evaluate.margin.loss": "auto"}, "evaluate.margin.loss: auto derives"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from ampbench.config.validation import validate
    from ampbench.data.prepare import prepare, save_prepared

    out = tmp_path_factory.mktemp("data") / "prepared"
    save_prepared(prepare(validate(TINY).prepare, out.parent / "raw"), out)
    return out


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and "mlflow" not in p.name and "data_in" not in p.parts}


def _invoke(stage: str, args: list[str], env: dict | None = None):
    return CliRunner().invoke(_stage(stage), args, env=env)


def _assert_clean_failure(result, expected: str, before: set[Path], root: Path, store: str):
    import mlflow

    assert result.exit_code not in (0, None), result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0, f"not one line: {err!r}"
    assert err.startswith("error: ") and expected in err, err
    assert "Traceback" not in result.output + result.stderr
    assert _files(root) == before, f"new files: {_files(root) - before}"
    assert store.startswith("sqlite:///")
    if not Path(store.removeprefix("sqlite:///")).exists():
        return  # the stage stopped before it opened the store: no run can be left RUNNING (and creating the store
        # here to search it costs 2-3 s of MLflow's migrations per case)
    mlflow.set_tracking_uri(store)
    assert not mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'RUNNING'",
                                  output_format="list")


def _args(stage: str, params: Path, tmp: Path, data: Path) -> list[str]:
    if stage == "check":
        return ["--params", str(params), "--out", str(tmp / "out" / "params-checked.txt")]
    if stage == "prepare":
        return ["--params", str(params), "--out", str(tmp / "out" / "prepared"), "--raw", str(tmp / "raw")]
    if stage == "train":
        return ["--precision", "fp32", "--params", str(params), "--data", str(data), "--out",
                str(tmp / "out" / "models" / "fp32"), "--resume-dir", str(tmp / "out" / ".resume")]
    return ["--params", str(params), "--data", str(data), "--models", str(tmp / "out" / "models"), "--reports",
            str(tmp / "out" / "reports")]


@pytest.mark.parametrize("case", PARAM_CASES, ids=[c[0] for c in PARAM_CASES])
def test_bad_params(case, tmp_path, prepared, mlflow_store, tiny_params, write_params):
    _, stage, changes, expected = case
    for key, value in changes.items():
        _set(tiny_params, key, value)
    path = write_params(tiny_params)
    before = _files(tmp_path)
    result = _invoke(stage, _args(stage, path, tmp_path, prepared))
    _assert_clean_failure(result, expected, before, tmp_path, mlflow_store)


def _env_case_setup(name: str, tmp: Path, prepared: Path, params: dict):
    """Break the environment for case ``name``; return (stage, extra env, data dir, expected text)."""
    data = tmp / "data_in" / "prepared"
    shutil.copytree(prepared, data)
    if name == "cuda-without-gpu":
        params["train"]["device"] = "cuda"
        return "train", {}, data, "no CUDA device is available"
    if name == "data-missing":
        return "train", {}, tmp / "nowhere", "run the prepare stage first"
    if name == "data-checksum":
        meta = json.loads((data / "meta.json").read_text())
        meta["checksum"] = "0" * 64
        (data / "meta.json").write_text(json.dumps(meta))
        return "train", {}, data, "checksum mismatch"
    if name in ("meta-shape-a-string", "meta-sizes-missing"):  # a KeyError/TypeError traceback before
        meta = json.loads((data / "meta.json").read_text())
        if name == "meta-shape-a-string":
            meta["input_shape"] = "1x8x8"
        else:
            del meta["sizes"]
        (data / "meta.json").write_text(json.dumps(meta))
        return "train", {}, data, ("field input_shape: Input should be a valid list (holds '1x8x8')"
                                   if name == "meta-shape-a-string" else "field sizes is missing")
    if name == "data-truncated":
        blob = (data / "train.pt").read_bytes()
        (data / "train.pt").write_bytes(blob[: len(blob) // 2])
        return "train", {}, data, "unreadable"
    if name == "data-wrong-shape":
        t = torch.load(data / "val.pt", weights_only=True)
        torch.save({"x": t["x"][:, :, :4, :4].contiguous(), "y": t["y"]}, data / "val.pt")
        return "train", {}, data, "does not match meta.json"
    if name == "mnist-missing":
        params["prepare"]["dataset"] = "mnist"
        return "prepare", {}, data, "(or .gz) not found in"
    if name == "cifar-download-fails":
        params["prepare"].update({"dataset": "cifar10", "download": True})
        # No network here: the download fails; the message says so and where to put the files.
        return "prepare", {}, data, "the download into"
    if name == "mlflow-uri-malformed":
        return "train", {"MLFLOW_TRACKING_URI": "nonsense://x"}, data, "not one MLflow can use"
    if name == "mlflow-uri-unreachable":
        return "train", {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, data, "is unreachable"
    if name == "output-under-a-file":
        (tmp / "out").mkdir()
        (tmp / "out" / "models").write_text("a file where a folder should be")
        return "train", {}, data, "Not a directory"
    if name == "models-missing":
        return "evaluate", {}, data, "train the fp32 arm first"
    raise AssertionError(name)


ENV_CASES = ["cuda-without-gpu", "data-missing", "data-checksum", "meta-shape-a-string", "meta-sizes-missing",
             "data-truncated", "data-wrong-shape",
             "mnist-missing", "cifar-download-fails", "mlflow-uri-malformed", "mlflow-uri-unreachable",
             "output-under-a-file", "models-missing"]


@pytest.mark.parametrize("name", ENV_CASES)
def test_bad_environments(name, tmp_path, prepared, mlflow_store, tiny_params, write_params):
    if name == "cuda-without-gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    stage, env, data, expected = _env_case_setup(name, tmp_path, prepared, tiny_params)
    path = write_params(tiny_params)
    before = _files(tmp_path)
    result = _invoke(stage, _args(stage, path, tmp_path, data), env=env)
    _assert_clean_failure(result, expected, before, tmp_path, mlflow_store)


# (id, train.model, factory module text or None, whether train.model_code names it, expected text). {m}: a module
# name of the case's own, so no case sees another's module in sys.modules.
MODEL_CASES = [
    ("factory-import-error", "{m}:build", "import a_package_this_machine_lacks\n", True, "cannot import {m}"),
    ("factory-wrong-output", "{m}:build",
     "from torch import nn\ndef build(shape, classes):\n    return nn.Sequential(nn.Flatten(), nn.LazyLinear(3))\n",
     True, "on input (1, 8, 8): returns torch.float32 of shape (2, 3) in training mode; expected logits of shape "
           "(2, 10)"),
    ("factory-untracked", "{m}:build", "def build(shape, classes):\n    return None\n", False,
     "train.model_code: src/ampbench/models/builtins.py does not hold {m}.py"),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_models_that_do_not_fit_the_data(case, tmp_path, prepared, mlflow_store, tiny_params, write_params,
                                         monkeypatch):
    """Caught by the dry run (or the code check) before any output or MLflow run exists. (Every kind of fault has a
    unit test in test_model_factory.py; these check the stage's handling of the three ways it can fail.)"""
    case_id, model, module, tracked, expected = case
    name = "user_model_" + case_id.replace("-", "_")
    model, expected = model.format(m=name), expected.format(m=name)
    code = tmp_path / "user_code"
    if module is not None:
        code.mkdir()
        (code / f"{name}.py").write_text(module)
        monkeypatch.syspath_prepend(str(code))
        monkeypatch.setattr(sys, "dont_write_bytecode", True)  # nothing new on disk, not even __pycache__
    tiny_params["train"].update(model=model, width=None)
    if tracked:
        tiny_params["train"]["model_code"] = str(code / f"{name}.py")
    path = write_params(tiny_params)
    before = _files(tmp_path)
    result = _invoke("train", _args("train", path, tmp_path, prepared))
    _assert_clean_failure(result, expected, before, tmp_path, mlflow_store)


def test_disk_full_while_checkpointing(tmp_path, prepared, mlflow_store, monkeypatch, tiny_params, write_params):
    """ENOSPC while writing a checkpoint: one line, the MLflow run FAILED (not RUNNING), no partial file."""
    import errno

    import mlflow


    def full(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr("ampbench.runtime.files.atomic_torch_save", full)
    monkeypatch.setattr("ampbench.training.checkpoint.atomic_torch_save", full)
    path = write_params(tiny_params)
    result = _invoke("train", _args("train", path, tmp_path, prepared))
    # Training had started, so progress lines precede it; the error itself is one line, the last.
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert [line for line in lines if line.startswith("error:")] == lines[-1:]
    assert "seed0.pt: No space left on device" in lines[-1]
    mlflow.set_tracking_uri(mlflow_store)
    runs = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list", filter_string=ARM_RUNS)
    assert [r.info.status for r in runs] == ["FAILED"]
    assert "No space left" in runs[0].data.tags["ampbench.error"]
    assert not [p for p in (tmp_path / "out").rglob("*.pt")]


def test_precision_not_in_params(tmp_path, prepared, mlflow_store, tiny_params, write_params):
    path = write_params(tiny_params)
    args = _args("train", path, tmp_path, prepared)
    args[1] = "fp8"
    before = _files(tmp_path)
    _assert_clean_failure(_invoke("train", args), "--precision 'fp8' is not in train.precisions", before, tmp_path,
                          mlflow_store)


# Nine lines that expand to 9^7 values wherever they are copied, hashed or logged (87 s, then MemoryError, inside
# train.model_args): refused while counting, which stops at the limit.
ALIAS_BOMB = "train:\n  model_args:\n    a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"    {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdef", "bcdefg", strict=True))


@pytest.mark.parametrize("content, expected", [(None, "no such params file"), ("train: [x\n", "not valid YAML"),
                                               ("- a\n- b\n", "expected a mapping"),
                                               (ALIAS_BOMB, "train.model_args.e: more than 20,000 values")])
def test_bad_params_files(tmp_path, prepared, mlflow_store, content, expected):
    path = tmp_path / "params.yaml"
    if content is not None:
        path.write_text(content)
    before = _files(tmp_path)
    _assert_clean_failure(_invoke("train", _args("train", path, tmp_path, prepared)), expected, before, tmp_path,
                          mlflow_store)


def test_fp32_modules_that_leave_an_arm_no_16_bit_work_are_refused(tmp_path, prepared, mlflow_store, tiny_params,
                                                                   write_params):
    """train.fp32_modules: ['*'] kept the whole model in float32: bf16's losses were fp32's while it was labelled,
    compared and recommended as bf16. The FLOP census on two samples refuses it before any work."""
    tiny_params["train"].update(precisions=["fp32", "bf16"], fp32_modules=["*"])
    args = _args("train", write_params(tiny_params), tmp_path, prepared)
    args[1] = "bf16"
    before = _files(tmp_path)
    _assert_clean_failure(_invoke("train", args), "train.fp32_modules: ['*'] keeps every module that computes in "
                          "float32, so bf16 would run no 16-bit", before, tmp_path, mlflow_store)
    tiny_params["train"]["fp32_modules"] = ["11"]  # the head alone: the rest still computes in bf16, so it trains
    args = _args("train", write_params(tiny_params), tmp_path, prepared)
    args[1] = "bf16"
    assert _invoke("train", args).exit_code == 0


def test_a_run_with_no_optimizer_step_fails(tmp_path, prepared, mlflow_store, monkeypatch, tiny_params, write_params):
    """Issue 14.2's safety net: should an epoch ever yield no batch (the params check refuses the known cases),
    the seed fails (run FAILED, exit 2) instead of evaluating an untrained model."""
    import mlflow

    import ampbench.data.loader
    import ampbench.stages.train

    monkeypatch.setattr(ampbench.stages.train, "check_steps", lambda *args: None)
    monkeypatch.setattr(ampbench.data.loader, "index_batches", lambda *args: [])
    result = _invoke("train", _args("train", write_params(tiny_params), tmp_path, prepared))
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == "error: fp32-seed0: training ran no optimizer step; its " \
                                                     "results would be untrained"
    mlflow.set_tracking_uri(mlflow_store)
    [run] = mlflow.search_runs(experiment_names=["ampbench-tests"], output_format="list", filter_string=ARM_RUNS)
    assert run.info.status == "FAILED"
    assert not (tmp_path / "out" / "models" / "fp32" / "summary.json").exists()


def test_batches_per_epoch_counts_what_the_loader_yields():
    from ampbench.data.loader import batches_per_epoch, index_batches

    generator = torch.Generator()
    for n in range(12):
        for batch in range(1, 6):
            for ranks in (1, 2, 3):
                assert batches_per_epoch(n, batch, ranks) == len(index_batches(n, batch, generator, ranks))


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    """(params file, models folder) of a tiny fp32-only run, trained once for the file-damage cases below."""
    _, path, models = train_fp32_only(tmp_path_factory.mktemp("trained"), prepared)
    return path, models


# What evaluate reads from models/fp32/, altered: (id, file, damage, expected text after the file name)
DAMAGED = [
    ("summary-garbage", "summary.json", b"{not json", "not valid JSON"),
    ("summary-empty-object", "summary.json", b"{}", "not a summary the train stage wrote"),
    ("summary-list", "summary.json", b"[1, 2]", "not a summary the train stage wrote"),
    ("summary-missing", "summary.json", None, "missing"),
    ("summary-other-seeds", "summary.json", "seeds", "no result for seed(s) [0]"),
    ("history-garbage", "history.json", b"\x00\x01", "not valid JSON"),
    ("history-list", "history.json", b"[]", "not a history the train stage wrote"),
    ("history-loss-a-word", "history.json", lambda h: h["seeds"]["0"][0].update(val_loss="low"),
     "field seeds.0.0.val_loss: Input should be a valid number (holds 'low')"),
    ("history-of-another-arm", "history.json", lambda h: h.update(arm="bf16"),
     "says it belongs to arm 'bf16', but it is in fp32's folder"),
    ("summary-seed-without-run-id", "summary.json", lambda s: s["seeds"]["0"].pop("run_id"),
     "field seeds.0.run_id is missing"),
    # Parses, but a field holds the wrong type (each one a TypeError/AttributeError traceback before): the field
    # is named, before any report is written.
    ("summary-seeds-null", "summary.json", lambda s: s.update(seeds=None), "field seeds: Input should be a valid"),
    ("summary-speed-a-word", "summary.json", lambda s: s.update(samples_per_s="fast"),
     "field samples_per_s: Input should be a valid number (holds 'fast')"),
    ("summary-final-a-list", "summary.json", lambda s: s["seeds"]["0"].update(final=[1]), "field seeds.0.final:"),
    ("summary-hardware-a-string", "summary.json", lambda s: s.update(hardware="cpu"), "field hardware:"),
    ("summary-steps-a-boolean", "summary.json", lambda s: s.update(skipped_steps=True),
     "field skipped_steps: Input should be a valid integer"),
    ("summary-of-another-arm", "summary.json", lambda s: s.update(arm="bf16"),
     "says it belongs to arm 'bf16', but it is in fp32's folder"),
    # Well-typed but impossible (issue 49.7): accepted, and reported as what the arm did.
    ("summary-epochs-negative", "summary.json", lambda s: s.update(epochs=-3),
     "field epochs: Input should be greater than or equal to 1 (holds -3)"),
    ("summary-seed-speed-nan", "summary.json", lambda s: s["seeds"]["0"].update(train_samples_per_s=float("nan")),
     "field seeds.0.train_samples_per_s: Input should be a finite number (holds nan)"),
    ("summary-speed-infinite", "summary.json", lambda s: s.update(samples_per_s=float("inf")),
     "field samples_per_s: Input should be a finite number (holds inf)"),
    ("summary-speed-negative", "summary.json", lambda s: s.update(samples_per_s=-120.0),
     "field samples_per_s: Input should be greater than 0 (holds -120.0)"),
    ("summary-memory-negative", "summary.json", lambda s: s.update(peak_memory_mb=-1.0),
     "field peak_memory_mb: Input should be greater than or equal to 0 (holds -1.0)"),
    ("summary-seconds-negative", "summary.json", lambda s: s["seeds"]["0"].update(train_seconds=-4.5),
     "field seeds.0.train_seconds: Input should be greater than or equal to 0 (holds -4.5)"),
    ("summary-steps-negative", "summary.json", lambda s: s.update(optimizer_steps=-7),
     "field optimizer_steps: Input should be greater than or equal to 0 (holds -7)"),
    ("checkpoint-truncated", "seed0.pt", "truncate", "checkpoint unreadable"),
    ("checkpoint-missing", "seed0.pt", None, "missing"),
    ("checkpoint-of-another-model", "seed0.pt", "weights", "not a checkpoint the train stage wrote"),
    # Another arm's (or seed's) checkpoint in this one's place: it was loaded and judged as this arm.
    ("checkpoint-of-another-arm", "seed0.pt", {"arm": "bf16"},
     "says it belongs to arm 'bf16', but it is in fp32's folder"),
    ("checkpoint-of-another-seed", "seed0.pt", {"seed": 3}, "says it belongs to seed 3, but it is in seed 0's file"),
    ("checkpoint-without-meta", "seed0.pt", {"meta": None}, "field the top level: Input should be"),
]


@pytest.mark.parametrize("case", DAMAGED, ids=[c[0] for c in DAMAGED])
def test_damaged_inputs_of_evaluate_are_one_line_naming_the_file(case, trained, prepared, tmp_path, mlflow_store):
    _, name, damage, expected = case
    params, models = trained
    shutil.copytree(models, tmp_path / "models")
    target = tmp_path / "models" / "fp32" / name
    if damage is None:
        target.unlink()
    elif callable(damage):
        summary = json.loads(target.read_text())
        damage(summary)
        target.write_text(json.dumps(summary))
    elif damage == "seeds":
        summary = json.loads(target.read_text())
        summary["seeds"] = {"7": summary["seeds"]["0"]}
        target.write_text(json.dumps(summary))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:1000])
    elif damage == "weights":
        ck = torch.load(target, weights_only=True)
        ck["model"] = {k + ".renamed": v for k, v in ck["model"].items()}
        torch.save(ck, target)
    elif isinstance(damage, dict):  # the checkpoint's meta changed: what it says it is
        ck = torch.load(target, weights_only=True)
        ck["meta"] = None if "meta" in damage else {**ck["meta"], **damage}
        torch.save(ck, target)
    else:
        target.write_bytes(damage)
    result = _invoke("evaluate", ["--params", str(params), "--data", str(prepared), "--models",
                                  str(tmp_path / "models"), "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in result.output, err
    assert err.startswith(f"error: {target}") and expected in err, err
    assert not (tmp_path / "reports").exists() or not any((tmp_path / "reports").rglob("*"))


@pytest.mark.parametrize("arms", [[1, 2], {"fp32": "fast"}, {"fp32": {"rounds": "many"}}],
                         ids=["list", "word", "rounds"])
def test_a_speed_result_with_wrong_typed_arms_is_one_line(arms, trained, prepared, tmp_path, mlflow_store):
    """reports/interleaved.json was the one input not read through a schema: wrong-typed arms were a traceback."""
    params, models = trained
    reports = tmp_path / "reports"
    reports.mkdir()
    speed = reports / "interleaved.json"
    speed.write_text(json.dumps({"device": "cpu", "device_type": "cpu", "params": {}, "arms": arms}))
    result = _invoke("evaluate", ["--params", str(params), "--data", str(prepared), "--models", str(models),
                                  "--reports", str(reports)])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {speed}: field arms") and "Traceback" not in err, err
    assert [p.name for p in reports.iterdir()] == ["interleaved.json"]  # nothing published


def test_a_store_that_fails_while_evaluate_logs_publishes_no_report(trained, prepared, tmp_path, mlflow_store,
                                                                     monkeypatch):
    """The reports were published before the MLflow logging, so a store that broke then left reports that looked
    finished while MLflow held nothing; now the logging runs from the staging folder, before anything is
    published."""
    from ampbench import tracking
    from ampbench.errors import StoreError

    params, models = trained

    def broken(*args, **kwargs):
        raise StoreError("MLflow store sqlite:///x.db: disk I/O error")

    monkeypatch.setattr(tracking, "log_to", broken)
    reports = tmp_path / "reports"
    result = _invoke("evaluate", ["--params", str(params), "--data", str(prepared), "--models", str(models),
                                  "--reports", str(reports)])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: MLflow store sqlite:///x.db: disk I/O error — no report was published (those in {reports} are as "
        "they were) and the trained models are kept: run the evaluate stage again once the store works")
    assert not [p for p in reports.rglob("*") if p.is_file()], "reports published although MLflow failed"
    monkeypatch.undo()  # the same evaluation with a working store publishes them
    result = _invoke("evaluate", ["--params", str(params), "--data", str(prepared), "--models", str(models),
                                  "--reports", str(reports)])
    assert result.exit_code == 0, result.output
    assert (reports / "report.md").exists() and (reports / "comparison.json").exists()


# Tracking URIs no run could outlive or no store answers at: (id, MLFLOW_TRACKING_URI, expected text)
BAD_URIS = [
    ("sqlite-without-a-path", "sqlite://", "names no database file"),
    ("sqlite-upper-case-without-a-path", "SQLITE://", "names no database file"),
    ("sqlite-in-memory", "sqlite:///:memory:", "names no database file"),
    ("sqlite-with-a-host", "sqlite://server/mlflow.db", "a SQLite URI has no host"),
    ("server-without-a-host", "http://:5000", "names no host"),
    ("port-not-a-number", "http://127.0.0.1:port", "is malformed"),
]


@pytest.mark.parametrize("stage", ["train", "evaluate"])
@pytest.mark.parametrize("case", BAD_URIS, ids=[c[0] for c in BAD_URIS])
def test_tracking_uris_at_their_edges_are_one_line_before_any_output(case, stage, trained, prepared, tmp_path,
                                                                     monkeypatch):
    """Each was an IndexError traceback, after evaluate had rewritten its reports, or (`:memory:`) a file of that
    name in the working folder; now one line before the stage writes anything."""
    _, uri, expected = case
    params, models = trained
    monkeypatch.chdir(tmp_path)
    shutil.copytree(models, tmp_path / "models")
    args = _args(stage, params, tmp_path, prepared)
    if stage == "evaluate":
        args[args.index("--models") + 1] = str(tmp_path / "models")
    before = _files(tmp_path)
    result = _invoke(stage, args, env={"MLFLOW_TRACKING_URI": uri})
    assert result.exit_code not in (0, None), result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and expected in err, err
    assert "Traceback" not in result.output + result.stderr
    assert _files(tmp_path) == before and not list(tmp_path.glob("*memory*"))


def test_every_accepted_uri_form_has_one_meaning():
    from ampbench.tracking.uris import parse

    assert parse("SQLITE:////srv/mlflow.db") == "sqlite:////srv/mlflow.db"  # SQLAlchemy needs the lower case
    assert parse("sqlite:///rel.db") == "sqlite:///rel.db"
    assert parse("Http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert parse("postgresql+psycopg2://u:p@db/mlflow") == "postgresql+psycopg2://u:p@db/mlflow"
    assert parse("databricks") == "databricks"


def test_a_stage_that_fails_under_dvc_says_how_to_get_its_outputs_back(tmp_path, prepared, mlflow_store, tiny_params,
                                                                        write_params):
    """DVC deletes a stage's outputs before running it; when the stage then fails, the line says how to restore them
    (DVC sets DVC_STAGE for the stage's command)."""
    tiny_params["train"]["epochs"] = True
    args = _args("train", write_params(tiny_params), tmp_path, prepared)
    before = _files(tmp_path)
    _assert_clean_failure(_invoke("train", args, env={"DVC_STAGE": "train@fp32"}),
                          "train.epochs: a boolean where a number belongs", before, tmp_path, mlflow_store)
    result = _invoke("train", args, env={"DVC_STAGE": "train@fp32"})
    assert "(DVC removed train@fp32's previous outputs before running it: `dvc checkout train@fp32` restores them " \
           "from its cache)" in result.stderr


def test_fp8_with_a_model_without_eligible_linear_layers_stops_even_the_fp32_stage(tmp_path, prepared, mlflow_store,
                                                                                 tiny_params, write_params):
    """small_cnn's only Linear layer is its 32→10 head: fp8_tensorwise would train as bf16 under an fp8 label. Every
    train stage (fp32's, which runs first, included) refuses it in one line before any work; an optimizer the
    arm's implementation lacks is refused by the check stage's validation, also in one line."""
    tiny_params["train"].update(precisions=["fp32", "fp8_tensorwise"])
    args = _args("train", write_params(tiny_params), tmp_path, prepared)
    before = _files(tmp_path)
    _assert_clean_failure(_invoke("train", args),
                          "train.model: no Linear layer of the model can train in float8 (11: 32→10 not divisible "
                          "by 16), so fp8_tensorwise would train as bf16", before, tmp_path, mlflow_store)
    tiny_params["train"].update(precisions=["fp32", "bf16_sr"], optimizer="sgd")
    args = _args("train", write_params(tiny_params), tmp_path, prepared)  # rewrites the same params.yaml
    _assert_clean_failure(_invoke("train", args),
                          "train.optimizer: 'sgd' with bf16_sr: torchao's _AdamW (stochastic rounding) has only adamw",
                          before, tmp_path, mlflow_store)
